#!/usr/bin/env bash
# Set up and run the test suite: formatting and lint (ruff, configured in pyproject.toml), then
# pytest, printing the 15 slowest tests; then the vLLM tests (tests/vllm_plugin/) in the vLLM environment
# (scripts/setup.sh vllm makes it), and the Model Runner V2 tests (tests/vllm_v2/) against vLLM 0.32, 0.33 and 0.34's
# own code under Triton's interpreter (scripts/setup.sh vllm-v2 makes that environment). Tests that need the embedded model pair are marked `slow` and skip
# cleanly when it is not installed. Extra arguments go to the main pytest run (e.g. -m "not e2e and not
# slow" for the quick loop; SPECROUTE_SKIP_VLLM=1 leaves the vLLM run out of a quick loop). pytest's exit
# code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test || exit 1
vllm_run=1
[ "${SPECROUTE_SKIP_VLLM:-0}" = 1 ] && vllm_run=0
if [ "$vllm_run" = 1 ]; then
  scripts/setup.sh vllm || exit 1
  scripts/setup.sh vllm-v2 || exit 1
fi
bin="${VIRTUAL_ENV:-.venv}/bin"
"$bin/ruff" format --check --quiet . || { echo "error: files need formatting: run $bin/ruff format ." >&2; exit 1; }
"$bin/ruff" check --quiet . || { echo "error: ruff check found problems (above): fix them or run $bin/ruff check --fix ." >&2; exit 1; }
"$bin/python" -m pytest -q --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
if [ "$vllm_run" = 1 ]; then
  echo "== the vLLM tests, in ${SPECROUTE_VLLM_VENV:-.venv-vllm} =="
  "${SPECROUTE_VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -q --durations=5 tests/vllm_plugin
  vrc=$?
  if [ "$vrc" -eq 5 ]; then
    echo "error: pytest collected no vLLM tests" >&2
    exit 1
  fi
  [ "$rc" -eq 0 ] && rc=$vrc
  v2="${SPECROUTE_VLLM_V2_VENV:-.venv-vllm-v2}"
  for release in 0.32.0 0.33.0 0.34.0; do  # 0.34.0 is the environment's own; the others' files go first on the path
    overlay="$v2/vllm-releases/$release"
    [ -d "$overlay" ] || overlay=""
    echo "== the vLLM Model Runner V2 tests against vLLM $release's own code (Triton's interpreter), in $v2 =="
    PYTHONPATH="$overlay" TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= "$v2/bin/python" -m pytest -q -p no:cacheprovider \
      --durations=3 tests/vllm_v2
    vrc=$?
    [ "$vrc" -eq 5 ] && { echo "error: pytest collected no vLLM V2 tests" >&2; vrc=1; }
    [ "$rc" -eq 0 ] && rc=$vrc
  done
fi
exit "$rc"
