#!/usr/bin/env bash
# Set up and run the test suite: formatting and lint (ruff, configured in pyproject.toml), then
# pytest, printing the 15 slowest tests. Tests that need the embedded model pair are marked `slow`
# and skip cleanly when it is not installed. Extra arguments go to pytest (e.g. -m "not e2e and not
# slow" for the quick loop). pytest's exit code 5 (no tests collected) is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test || exit 1
bin="${VIRTUAL_ENV:-.venv}/bin"
"$bin/ruff" format --check --quiet . || { echo "error: files need formatting: run $bin/ruff format ." >&2; exit 1; }
"$bin/ruff" check --quiet . || { echo "error: ruff check found problems (above): fix them or run $bin/ruff check --fix ." >&2; exit 1; }
"$bin/python" -m pytest -q --durations=15 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
