#!/usr/bin/env bash
# The resumable labelling chain of docs/usage.md ("Labels at scale"), run niced in the background, in
# stages (config[:max_examples]): full-answer labels on the first 150, 300, 450, then 630 GSM8K problems (the
# yardstick routers are scored on, and what the answer-level target is measured over), short-horizon
# labels on the same 150 (where the cheap label meets the full one) and on the first 600, then MBPP.
# A stage with a larger max_examples grows the folder an earlier stage made (only the new problems are
# labelled); each stage resumes where an interrupted run stopped (its shards are written atomically) and
# a finished stage is skipped. Where data/labels/<config>.jsonl.gz exists (labels exported by
# `scripts/label-background.sh export` and committed), its problems are replayed, not searched again:
# the answers and verdicts come from the file and only the record rows are computed; each finished stage
# adds its new problems to its label file, and `export` those of unfinished folders too (commit data/labels/);
# both export with --add-only: a committed file's own entries are never re-derived from a replay.
#   nohup scripts/label-background.sh > runs/label.log 2>&1 &
#   LABEL_STAGES="gsm8k-horizon" scripts/label-background.sh       # one stage, the config's own size
#   scripts/label-background.sh export                             # labels so far -> data/labels/
set -u
cd "$(dirname "$0")/.."
bin=${SPECROUTE_BIN:-.venv/bin}
configs_dir=${LABEL_CONFIGS:-configs/studies/gen}   # <config>.yaml files
records=${LABEL_RECORDS:-runs/records}      # <config>/ record folders
files=${LABEL_FILES:-data/labels}           # <config>.jsonl.gz label files
DEFAULT_STAGES="gsm8k-consequence:150 gsm8k-consequence:300 gsm8k-consequence:450 gsm8k-consequence:630 gsm8k-horizon:150 gsm8k-horizon:600 mbpp-consequence mbpp-horizon:250 gsm8k-horizon mbpp-horizon"
stages=${LABEL_STAGES:-$DEFAULT_STAGES}
configs=$(for stage in $stages; do echo "${stage%%:*}"; done | sort -u)

if [ "${1:-}" = export ]; then  # each folder's finished shards -> data/labels/<config>.jsonl.gz
  for config in $configs; do
    folder=$records/$config
    [ -d "$folder" ] || continue
    source=$folder
    if [ ! -f "$folder/manifest.json" ]; then  # still recording: a snapshot of its finished shards
      source=$records/.export-$config
      rm -rf "$source"
      "$bin/specroute" snapshot "$folder" "$source" || { echo "== $config: nothing finished yet"; continue; }
    fi
    "$bin/specroute" labels export "$source" "$files/$config.jsonl.gz" --add-only || exit 1
    [ "$source" = "$folder" ] || rm -rf "$source"
  done
  exit 0
fi

for stage in $stages; do
  config=${stage%%:*}
  args=()
  [[ $stage == *:* ]] && args+=("max_examples=${stage#*:}")
  [ -f "$files/$config.jsonl.gz" ] && args+=("labels_from=$files/$config.jsonl.gz")
  echo "== $(date -u +%FT%TZ) $stage"
  nice -n 19 "$bin/specroute" gen --config "$configs_dir/$config.yaml" output="$records/$config" "${args[@]}" || { echo "== $stage failed (rc $?)"; exit 1; }
  # a finished stage's labels go to its label file at once (no model is loaded for a finished folder)
  "$bin/specroute" labels export "$records/$config" "$files/$config.jsonl.gz" --add-only || exit 1
done
echo "== $(date -u +%FT%TZ) all labelled"
