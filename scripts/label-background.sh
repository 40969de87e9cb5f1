#!/usr/bin/env bash
# The resumable labelling chain of docs/labels.md, run niced in the background: full-answer labels on
# the first 150 GSM8K problems, then short-horizon labels on all of GSM8K and MBPP. Each stage resumes
# where an interrupted run stopped (its shards are written atomically); a finished stage is skipped.
#   nohup scripts/label-background.sh > runs/label.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
SPECROUTE=${SPECROUTE:-.venv/bin/specroute}
for config in ${LABEL_CONFIGS:-gsm8k-consequence gsm8k-horizon mbpp-horizon}; do
  echo "== $(date -u +%FT%TZ) $config"
  nice -n 19 "$SPECROUTE" gen --config "configs/gen/$config.yaml" || { echo "== $config failed (rc $?)"; exit 1; }
done
echo "== $(date -u +%FT%TZ) all labelled"
