#!/usr/bin/env bash
# GaLore through the CLI (optim.type = galore_adamw) on the tiny CPU model: the loss goes down,
# 2 ranks train like 1 rank with the same global batch, the offload modes change nothing, a
# checkpoint resumes with the losses of the run that never stopped (on 2 ranks bit for bit, and
# on 1 rank from 2 ranks' checkpoint), the log shows the optimizer state against AdamW's, and
# GaLore with LoRA is refused naming the key.
# usage: galore.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=40 --model.intermediate_size=72
        --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=4
        --train.steps=16 --train.eval_every=8 --optim.eps=1e-6
        --optim.type=galore_adamw --galore.rank=4 --galore.update_proj_gap=5
        --galore.moments_on_refresh=project --ckpt.every=8)
# Every run saves at step 8: a save completes the pipelined refreshes in flight (galore.refresh's
# default), so the runs compared below must all have saved at the same steps.

"${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.micro_batch_size=4 --train.out_dir="$work/one" > "$work/one.log"
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --train.out_dir="$work/two" > "$work/two.log"
grep -q "optimizer state per rank with GaLore (rank 4, 14 projected matrices)" "$work/two.log" \
  || { echo "FAIL: no GaLore memory line"; cat "$work/two.log"; exit 1; }
grep "optimizer state per rank with GaLore" "$work/two.log"
first=$(losses "$work/one/metrics.jsonl" | head -1)
last=$(losses "$work/one/metrics.jsonl" | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' \
  || { echo "FAIL: the loss went from $first to $last"; exit 1; }
echo "1 rank: loss $first -> $last"
rel=$(max_rel "$work/one/metrics.jsonl" "$work/two/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: 2 ranks differ from 1 rank by $rel"; exit 1; }
echo "2 ranks vs 1 rank: largest relative loss difference $rel"

for mode in optimizer params; do
  "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --parallel.offload=$mode \
    --train.out_dir="$work/off-$mode" > /dev/null
  cmp <(losses "$work/two/metrics.jsonl") <(losses "$work/off-$mode/metrics.jsonl") \
    || { echo "FAIL: offload=$mode changed the losses"; exit 1; }
done

# 2 ranks killed after step 8 (the checkpoint holds moments and projectors mid-gap) resume on 2
# ranks with the same losses, and on 1 rank to the rounding of the sums.
for resume_ranks in 2 1; do
  dir=$work/re$resume_ranks
  rc=0
  FRUGAL_INJECT_FAULT=exit:1:9 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --ckpt.async=false \
    --train.micro_batch_size=2 --train.out_dir="$dir" >/dev/null 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
  [ "$(cat "$dir/ckpt/LATEST")" = step_00000008 ] || { echo "FAIL: no step-8 checkpoint"; exit 1; }
  "${mpi[@]}" -np $resume_ranks "$frugal" train "${common[@]}" --train.micro_batch_size=$((4 / resume_ranks)) \
    --train.resume=true --train.out_dir="$dir" > "$dir.log"
  grep -q "resumed from step 8" "$dir.log" || { echo "FAIL: no resume"; cat "$dir.log"; exit 1; }
  if [ "$resume_ranks" -eq 2 ]; then
    cmp <(losses "$work/two/metrics.jsonl") <(losses "$dir/metrics.jsonl") \
      || { echo "FAIL: the resumed losses differ from the run that never stopped"; exit 1; }
    echo "resume on 2 ranks: the same losses as the run that never stopped"
  else
    rel=$(max_rel "$work/two/metrics.jsonl" "$dir/metrics.jsonl")
    awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: 2->1 rank resume differs by $rel"; exit 1; }
    echo "resume of a 2-rank checkpoint on 1 rank: largest relative loss difference $rel"
  fi
done

rc=0
"$frugal" train "${common[@]}" --train.type=lora --train.out_dir="$work/lora" > "$work/lora.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "config key 'optim.type': galore_adamw trains full weights" "$work/lora.log" \
  || { echo "FAIL: GaLore with LoRA was not refused by key"; cat "$work/lora.log"; exit 1; }
# [galore] keys given to an AdamW run train nothing of GaLore: said, naming the keys.
"$frugal" train "${common[@]}" --optim.type=adamw --galore.stagger=false \
  --train.steps=1 --train.out_dir="$work/adamw" > "$work/adamw.log" 2>&1 \
  || { echo "FAIL: AdamW with [galore] keys"; cat "$work/adamw.log"; exit 1; }
grep -q "warning: .*config keys ignored (optim.type is adamw): galore.rank, galore.update_proj_gap, galore.moments_on_refresh, galore.stagger$" "$work/adamw.log" \
  || { echo "FAIL: the ignored [galore] keys were not named"; cat "$work/adamw.log"; exit 1; }
echo "integration galore: ok"
