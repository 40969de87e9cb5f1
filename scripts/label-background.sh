#!/usr/bin/env bash
# The resumable labelling chain of docs/usage.md ("Labels at scale"), run niced in the background:
# short-horizon labels on all of GSM8K (the cheap label routers train on at scale), full-answer labels
# on the first 300 GSM8K problems (the first 150 done 2026-12-02; they score those routers), short-
# horizon labels on all of MBPP, then full-answer labels on the first 150 MBPP problems. Each stage
# resumes where an interrupted run stopped (its shards are written atomically); a finished stage is
# skipped.
#   nohup scripts/label-background.sh > runs/label.log 2>&1 &
set -u
cd "$(dirname "$0")/.."
SPECROUTE=${SPECROUTE:-.venv/bin/specroute}
for config in ${LABEL_CONFIGS:-gsm8k-horizon gsm8k-consequence mbpp-horizon mbpp-consequence}; do
  echo "== $(date -u +%FT%TZ) $config"
  nice -n 19 "$SPECROUTE" gen --config "configs/gen/$config.yaml" || { echo "== $config failed (rc $?)"; exit 1; }
done
echo "== $(date -u +%FT%TZ) all labelled"
