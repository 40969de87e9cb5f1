#!/usr/bin/env bash
# Set up and run the test suite. Tests that need the embedded model pair are marked `slow` and
# skip cleanly when it is not installed. pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test || exit 1
py="${VIRTUAL_ENV:-.venv}/bin/python"
"$py" -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
