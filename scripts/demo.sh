#!/usr/bin/env bash
# The main job: set up specroute with the embedded model pair and decode a GSM8K-style question
# with a speculative cascade, compared side by side with the verifier alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh models
py="${VIRTUAL_ENV:-.venv}/bin"
"$py/specroute" generate --chat --compare --rule token_v3 --alpha 0.3 --gamma 4 --max-new-tokens 128 \
  --prompt "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?" "$@"
