#!/usr/bin/env bash
# The gpu preset on a machine with CUDA GPUs, end to end, then the same stages across every visible
# GPU with torchrun. Usage: bash scripts/gpu.sh [reduced]
#   reduced: 100 examples per task and 8 online prompts (minutes on one GPU), to check a GPU machine
#   before the full preset (1000 examples per task, 32 online prompts).
# Assumes CUDA and a CUDA build of torch (keep the one the machine has; setup.sh does not replace it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh models,test
py="${VIRTUAL_ENV:-.venv}/bin/python"
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible')"
gpus=$("$py" -c "import torch; print(torch.cuda.device_count())")
out=runs/gpu
if [ "${1:-}" = "reduced" ]; then
  n=100; prompts=8
else
  n=1000; prompts=32
fi
# 1. one process, one GPU: the whole pipeline (the demo's gpu preset, or its reduced form)
if [ "${1:-}" = "reduced" ]; then
  "$py" -m specroute.cli gen --config configs/gen/gsm8k.yaml device=cuda max_examples=$n judge=true output=$out/records/gsm8k
  "$py" -m specroute.cli train --config configs/train/judge.yaml records=[$out/records/gsm8k] accelerator=gpu \
      output=$out/routers/judge
  "$py" -m specroute.cli eval --config configs/eval/gsm8k.yaml device=cuda records=[$out/records/gsm8k] \
      routers=[$out/routers/judge] online_methods=[judge,token_v2,lossless] max_prompts=$prompts gamma=auto \
      output=$out/eval/gsm8k
else
  "$py" -m specroute.cli demo --preset gpu --output $out/demo
fi
# 2. every GPU: the same recording and evaluation split by rank (rank 0 writes manifest and reports)
"$py" -m torch.distributed.run --standalone --nproc-per-node="$gpus" -m specroute.cli gen \
    --config configs/gen/gsm8k.yaml device=cuda max_examples=$n judge=true output=$out/records-ddp/gsm8k
"$py" -m torch.distributed.run --standalone --nproc-per-node="$gpus" -m specroute.cli eval \
    --config configs/eval/gsm8k.yaml device=cuda records=[$out/records-ddp/gsm8k] routers=[] max_prompts=$prompts \
    online_methods=[token_v2,lossless] output=$out/eval-ddp/gsm8k
"$py" -m specroute.cli train --config configs/train/judge.yaml records=[$out/records-ddp/gsm8k] accelerator=gpu \
    devices="$gpus" strategy=ddp output=$out/routers-ddp/judge
echo "gpu run done: $out"
