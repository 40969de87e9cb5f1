#!/usr/bin/env bash
# Set up vLLM's Model Runner V2 acceptance on this CPU, for the plugin's V2 tests (tests/vllm_v2/):
# scripts/setup.sh vllm-v2 (calls this). Mainline vLLM 0.32-0.34 wheels are CUDA builds that cannot run an engine
# here, but the Python files of their V2 acceptance (RejectionSampler._verify, rejection_sample and its Triton
# kernels) run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1; tests/vllm_v2/interp.py bridges
# the interpreter's gaps). This makes .venv-vllm-v2 (SPECROUTE_VLLM_V2_VENV) with the local torch==2.13.0 CPU
# wheel, triton==3.8.0 (what vLLM 0.33/0.34's torch 2.14 pins; the bridges touch its interpreter), vLLM 0.34.0
# installed --no-deps with the pure-Python packages its V2 sampling imports (held to the wheel's own pins), the
# Python files of vLLM 0.32.0 and 0.33.0 beside it (<venv>/vllm-releases/<version>, put first on PYTHONPATH to
# test that release), and specroute (editable, with its test extras).
# The wheels are downloaded once into ~/.cache/specroute/vllm-wheels (SPECROUTE_WHEELS; 240-340 MB each) and
# reused; a second run installs nothing. pip's output goes to <venv>/specroute-setup.log.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPECROUTE_VLLM_V2_VENV:-.venv-vllm-v2}"
wheels="${SPECROUTE_WHEELS:-$HOME/.cache/specroute/vllm-wheels}"
RELEASES="0.32.0 0.33.0 0.34.0"
MAIN=0.34.0  # installed into the venv; the others are overlays
TRITON=3.8.0
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
log="$venv/specroute-setup.log"
: > "$log"
tag="setup vllm-v2"
source scripts/setup_lib.sh  # quiet, have
wheel_of() { ls "$wheels"/vllm-"$1"-*manylinux_2_28_x86_64.whl 2>/dev/null | head -n 1; }
mkdir -p "$wheels"
for v in $RELEASES; do
  if [ -z "$(wheel_of "$v")" ]; then
    echo "[setup vllm-v2] downloading vllm==$v's wheel into $wheels (once; about 300 MB)"
    quiet "$py" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 "vllm==$v" -d "$wheels"
  fi
done
quiet "$py" -m pip install -q --upgrade pip
if ! have torch 2.13.0 && ! have torch 2.13.0+cpu; then
  echo "[setup vllm-v2] installing torch==2.13.0 (CPU) into $venv"
  quiet "$py" -m pip install -q torch==2.13.0
fi
have triton "$TRITON" || { echo "[setup vllm-v2] installing triton==$TRITON"; quiet "$py" -m pip install -q "triton==$TRITON"; }
pins="$venv/specroute-vllm-pins.txt"
if ! have vllm "$MAIN"; then
  echo "[setup vllm-v2] installing vllm==$MAIN's Python files (--no-deps) and what its V2 sampling imports"
  quiet "$py" -m pip install -q --no-deps "$(wheel_of "$MAIN")"
fi
# the wheel's own pins (its METADATA), without torch and triton (held at the versions above) and extras
"$py" - "$pins" <<'PY'
import importlib.metadata as m, re, sys
keep = []
for req in m.requires("vllm") or []:
    if "extra ==" in req:
        continue
    name = re.split(r"[ ;<>=!~\[]", req, maxsplit=1)[0].lower()
    if name.startswith(("torch", "triton", "nvidia", "flashinfer", "cuda")):
        continue
    keep.append(re.sub(r"\[[^\]]*\]", "", req, count=1))  # constraints take no extras
keep.append("torch==2.13.0")
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PY
if ! "$py" -c "import openai_harmony, xgrammar, llguidance, fastapi, partial_json_parser, einops" >/dev/null 2>&1; then
  quiet "$py" -m pip install -q -c "$pins" packaging regex psutil pyzmq urllib3 requests pydantic transformers aiohttp \
    pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo cbor2 prometheus_client llguidance xgrammar \
    oss-harmony openai fastapi partial-json-parser einops
fi
for v in $RELEASES; do
  [ "$v" = "$MAIN" ] && continue
  overlay="$venv/vllm-releases/$v"
  if [ ! -f "$overlay/vllm/__init__.py" ]; then
    echo "[setup vllm-v2] unpacking vllm==$v's Python files into $overlay"
    rm -rf "$overlay.partial" && mkdir -p "$overlay.partial"
    quiet "$py" -m zipfile -e "$(wheel_of "$v")" "$overlay.partial"
    find "$overlay.partial" -name '*.so' -delete  # CUDA extensions: never loaded on these paths
    rm -rf "$overlay" && mv "$overlay.partial" "$overlay"
  fi
done
if ! "$py" -m pip show -q specroute >/dev/null 2>&1; then
  echo "[setup vllm-v2] installing specroute (editable, with its test extras) into $venv"
  quiet "$py" -m pip install -q -e ".[test]" -c "$pins"
fi
for v in $RELEASES; do  # each release's V2 modules the plugin hooks import here
  overlay="$venv/vllm-releases/$v"
  [ "$v" = "$MAIN" ] && overlay=""
  quiet env PYTHONPATH="$overlay" TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= "$py" -c \
    "import vllm.v1.worker.gpu.spec_decode.rejection_sampler, vllm.v1.worker.gpu.model_runner, router.vllm.runner_v2"
done
echo "[setup vllm-v2] ready: $py (vLLM $RELEASES below the engine, Triton $TRITON's interpreter)"
