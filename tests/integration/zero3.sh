#!/usr/bin/env bash
# ZeRO-3 through the CLI with mpirun: 2 ranks train like 1 rank with the same global batch,
# offload modes change nothing, a checkpoint saved on 2 ranks resumes on 1, and a rank that
# dies, hangs or runs another configuration stops every rank with a message.
# usage: zero3.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=40 --model.intermediate_size=72
        --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=4
        --train.steps=12 --train.eval_every=6 --optim.eps=1e-6)

"${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.micro_batch_size=4 --train.out_dir="$work/one" >/dev/null
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --train.out_dir="$work/two" > "$work/two.log"
grep -q "2 rank(s) = dp 2 x cp 1, ZeRO-3" "$work/two.log" || { echo "FAIL: not running 2 ranks"; cat "$work/two.log"; exit 1; }
rel=$(max_rel "$work/one/metrics.jsonl" "$work/two/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: 2 ranks differ from 1 rank by $rel"; exit 1; }
echo "2 ranks vs 1 rank: largest relative loss difference $rel"

for mode in optimizer params; do
  "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --parallel.offload=$mode \
    --train.out_dir="$work/off-$mode" > "$work/off-$mode.log"
  cmp <(losses "$work/two/metrics.jsonl") <(losses "$work/off-$mode/metrics.jsonl") \
    || { echo "FAIL: offload=$mode changed the losses"; exit 1; }
done

# A checkpoint written by 2 ranks (killed after step 6) resumes on 1 rank.
rc=0
# Synchronous saves: the checkpoint before the injected exit is committed when it hits (an
# asynchronous one may still be in flight; tests/integration/async_ckpt.sh covers those).
FRUGAL_INJECT_FAULT=exit:1:7 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --ckpt.async=false --train.micro_batch_size=2 \
  --ckpt.every=6 --train.out_dir="$work/re" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
[ "$(cat "$work/re/ckpt/LATEST")" = step_00000006 ] || { echo "FAIL: no step-6 checkpoint"; exit 1; }
"${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.micro_batch_size=4 --ckpt.every=6 \
  --train.resume=true --train.out_dir="$work/re" > "$work/re.log"
grep -q "resumed from step 6" "$work/re.log" || { echo "FAIL: no resume"; cat "$work/re.log"; exit 1; }
rel=$(max_rel "$work/one/metrics.jsonl" "$work/re/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: 2->1 rank resume differs by $rel"; exit 1; }
echo "resume of a 2-rank checkpoint on 1 rank: largest relative loss difference $rel"

expect_failure() {  # name, pattern, command...
  local name=$1 pattern=$2
  shift 2
  local rc=0 start=$SECONDS
  timeout 120 "$@" > "$work/$name.out" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAIL: $name exited $rc after $((SECONDS - start)) s"; cat "$work/$name.out"; exit 1
  fi
  grep -q -- "$pattern" "$work/$name.out" || { echo "FAIL: $name said:"; cat "$work/$name.out"; exit 1; }
  echo "$name: stopped with exit $rc after $((SECONDS - start)) s"
}
expect_failure mismatch "runs a different configuration from rank 0: train.seed = '2'" \
  "${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.out_dir="$work/m" --train.seed=1 : \
  -np 1 "$frugal" train "${common[@]}" --train.out_dir="$work/m" --train.seed=2
grep -q "another rank runs a different configuration" "$work/mismatch.out" \
  || { echo "FAIL: rank 0 did not report the mismatch"; cat "$work/mismatch.out"; exit 1; }
expect_failure dead-rank "injected fault 'exit'" env FRUGAL_INJECT_FAULT=exit:1:3 \
  "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --train.out_dir="$work/x"
# A hung rank: the others stop after parallel.timeout_s, once (not once per operation still in
# flight): the time from the hang to the report, each line stamped as it arrives, is the
# timeout (0.9 x, for the ranks' skew) and below 1.5 times it.
timeout_s=5
stamped() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
{ rc=0; FRUGAL_INJECT_FAULT=hang:1:3 timeout 120 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" \
    --train.micro_batch_size=2 --parallel.timeout_s=$timeout_s --train.out_dir="$work/y" 2>&1 \
    || rc=$?; echo "- exit $rc"; } | stamped > "$work/hung-rank.out"
rc=$(sed -n 's/^[0-9.]* - exit //p' "$work/hung-rank.out")
hung_at=$(grep -m1 "injected fault 'hang'" "$work/hung-rank.out" | cut -d' ' -f1)
told_at=$(grep -m1 "waited .* s for the other ranks" "$work/hung-rank.out" | cut -d' ' -f1)
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ -z "$hung_at" ] || [ -z "$told_at" ]; then
  echo "FAIL: hung-rank exited $rc"; cat "$work/hung-rank.out"; exit 1
fi
awk -v a="$hung_at" -v b="$told_at" -v t=$timeout_s 'BEGIN { d = b - a; exit !(d >= 0.9 * t && d < 1.5 * t) }' \
  || { echo "FAIL: a hung rank was reported $(awk -v a="$hung_at" -v b="$told_at" 'BEGIN { print b - a }') s after it hung, with parallel.timeout_s = $timeout_s"
       cat "$work/hung-rank.out"; exit 1; }
echo "hung-rank: reported $(awk -v a="$hung_at" -v b="$told_at" 'BEGIN { printf "%.1f", b - a }') s after the hang (parallel.timeout_s = $timeout_s), exit $rc"
echo "integration zero3: ok"
