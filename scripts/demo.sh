#!/usr/bin/env bash
# The main job: set up specroute with the embedded model pair (Qwen2.5-Coder 0.5B drafter, 1.5B
# verifier) and run the whole pipeline on real GSM8K and MBPP data: record -> train routers ->
# evaluate them against every plug-in rule, offline and in the real decoding loop, each stage on the
# engine (torch or llama.cpp) priced faster on this machine. It prints the time it expects before
# starting; a rerun reuses finished stages. Extra arguments go to
# `specroute demo` (e.g. --preset tiny for a one-minute run on tiny random models, --fresh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh models,llamacpp
py="${VIRTUAL_ENV:-.venv}/bin"
"$py/specroute" demo --preset cpu "$@"
