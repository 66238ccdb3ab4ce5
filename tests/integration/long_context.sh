#!/usr/bin/env bash
# The long-context recipe on CPU ranks (tools/long-context-recipe, doc/long-context.md): a tiny
# base trained on 64-token windows, its context extended to 256 tokens by position
# interpolation and by YaRN, each fine-tuned on 2 context-parallel ranks, and the loss by
# position bucket on long validation windows: past its context the base degrades, the
# fine-tuned extensions do not, and fine-tuning improves on each scaling applied alone.
# usage: long_context.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
FRUGAL=$frugal_binary "$2/tools/long-context-recipe" "$work/lc" > "$work/recipe.log" 2>&1 \
  || { cat "$work/recipe.log"; exit 1; }
grep '^|' "$work/recipe.log"
results=$work/lc/results.jsonl
[ "$(wc -l < "$results")" -eq 5 ] || { echo "FAIL: expected 5 result lines"; cat "$results"; exit 1; }
# The loss of the last bucket (positions 192-255) of a result line.
last_bucket() { sed -n "$1p" "$results" | grep -o '"loss":[^,}]*' | tail -n 1 | cut -d: -f2; }
first_bucket() { sed -n "$1p" "$results" | grep -o '"loss":[^,}]*' | sed -n 2p | cut -d: -f2; }
base=$(last_bucket 1) linear_before=$(last_bucket 2) linear=$(last_bucket 3)
yarn_before=$(last_bucket 4) yarn=$(last_bucket 5)
check() {  # check A B MARGIN WHAT: A < B - MARGIN
  awk -v a="$1" -v b="$2" -v m="$3" 'BEGIN { exit !(a < b - m) }' || { echo "FAIL: $4 ($1 vs $2)"; exit 1; }
}
check "$linear" "$base" 0.1 "PI fine-tuned does not beat the base past its context"
check "$yarn" "$base" 0.1 "YaRN fine-tuned does not beat the base past its context"
check "$linear" "$linear_before" 0 "fine-tuning does not improve on PI alone"
check "$yarn" "$yarn_before" 0 "fine-tuning does not improve on YaRN alone"
# Past its context the base's loss rises above its own first bucket's; the extensions' stays near.
check "$(first_bucket 1)" "$base" 0.1 "the base does not degrade past its context"
check "$yarn" "$(first_bucket 5)" -0.05 "YaRN fine-tuned degrades along the window"
echo "integration long_context: ok"
