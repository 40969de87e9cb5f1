#!/usr/bin/env bash
# The resumable labelling chain of docs/usage.md ("Labels at scale"), run niced in the background, in
# stages (config[:max_examples]): short-horizon labels on the first 150 GSM8K problems (every split of
# them: the problems with full-answer labels, where routers trained on the cheap label are scored), then
# on the first 600 GSM8K and 250 MBPP problems (the cheap label routers train on at scale), full-answer labels on the first 150 MBPP and 300 GSM8K
# problems (they score those routers; GSM8K's first 150 done 2026-12-02), then short-horizon labels on
# the rest of both tasks. A stage with a larger max_examples grows the folder the earlier stage made
# (only the new problems are labelled); each stage resumes where an interrupted run stopped (its shards
# are written atomically) and a finished stage is skipped.
#   nohup scripts/label-background.sh > runs/label.log 2>&1 &
#   LABEL_STAGES="gsm8k-horizon" scripts/label-background.sh       # one stage, the config's own size
set -u
cd "$(dirname "$0")/.."
SPECROUTE=${SPECROUTE:-.venv/bin/specroute}
DEFAULT_STAGES="gsm8k-horizon:150 gsm8k-horizon:600 mbpp-horizon:250 mbpp-consequence gsm8k-consequence gsm8k-horizon mbpp-horizon"
for stage in ${LABEL_STAGES:-$DEFAULT_STAGES}; do
  config=${stage%%:*}
  size=()
  [[ $stage == *:* ]] && size=("max_examples=${stage#*:}")
  echo "== $(date -u +%FT%TZ) $stage"
  nice -n 19 "$SPECROUTE" gen --config "configs/gen/$config.yaml" "${size[@]}" || { echo "== $stage failed (rc $?)"; exit 1; }
done
echo "== $(date -u +%FT%TZ) all labelled"
