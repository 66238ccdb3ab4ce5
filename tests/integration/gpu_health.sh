#!/usr/bin/env bash
# The health guards on the GPU (one rank, parallel.device = cuda), each injected fault
# (FRUGAL_INJECT_FAULT) detected in the CUDA gradient pass and handled as configured: NaN in the
# gradients (the step skipped, the unit named), a loss spike (warn, skip_batch, rollback: the
# rolled-back run ends within 1 % of a clean run's final validation loss), a non-deterministic
# recompute (unit named). The faults that need a second rank (a slow rank, a replicated tensor
# that differs) are in health.sh on CPU ranks. Skips itself (exit 0) without a GPU.
# usage: gpu_health.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
require_gpu "$2"
export OMP_NUM_THREADS=2

"$frugal_binary" prepare "$corpus" --out "$work/data" --vocab-size 512 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=128 --model.intermediate_size=352
        --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2
        --model.vocab_size=512 --model.max_position_embeddings=128 --train.seq_len=64
        --train.micro_batch_size=8 --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=4
        --train.sample_tokens=0 --monitor.log_every=5 --ckpt.every=5 --ckpt.async=false
        --parallel.device=cuda)
fail() { echo "FAIL: $*"; exit 1; }
# train NAME FAULT ARGS...: one GPU rank, the log in $work/NAME.log, the run in $work/NAME.
train() {
  local name=$1 fault=$2
  shift 2
  FRUGAL_INJECT_FAULT=$fault "$frugal_binary" train "${common[@]}" --train.out_dir="$work/$name" \
    "$@" > "$work/$name.log" 2>&1 || { tail -n 20 "$work/$name.log"; fail "$name: frugal train failed"; }
}
record() { grep "\"step\":$2," "$work/$1/metrics.jsonl" | grep '"loss"'; }
final_val() { grep -o '"val_loss":[^,}]*' "$work/$1/metrics.jsonl" | tail -1 | cut -d: -f2; }

train clean "" --train.steps=80
r=$(record clean 10)
for part in '"health"' '"layers.1":{"norm"' '"bf16_grad":{"overflow":0' '"sm_clock_mhz"'; do
  grep -q "$part" <<< "$r" || fail "clean: step 10's record lacks $part"
done

train nan nan:0:7 --train.steps=12
grep -q 'step 7: .*non-finite gradient values, the first in unit layers.0; the step is skipped' "$work/nan.log" \
  || fail "nan: no warning naming layers.0"
record nan 7 | grep -q '"skipped":true' || fail "nan: step 7 not skipped"

train warn spike:0:22 --train.steps=30 --monitor.on_divergence=warn
grep -q 'step 23: loss .* is a spike (z = ' "$work/warn.log" || fail "warn: spike not reported"
train skip spike:0:22 --train.steps=30 --monitor.on_divergence=skip_batch
record skip 23 | grep -q '"verdict":"skipped_spike"' || fail "skip_batch: step 23 not marked"
train rollback spike:0:22 --train.steps=80 --monitor.on_divergence=rollback --monitor.rollback_lr_steps=10
grep -q 'step 23: .*rolled back to step 20' "$work/rollback.log" || fail "rollback: no rollback to step 20"
clean_val=$(final_val clean) rolled_val=$(final_val rollback)
awk -v a="$clean_val" -v b="$rolled_val" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d < 0.01) }' \
  || fail "rollback: final val_loss $rolled_val is not within 1 % of the clean run's $clean_val"
echo "rollback on the GPU: final val_loss $rolled_val, clean $clean_val"

train recompute recompute:0:6 --train.steps=8 --train.activation_checkpointing=full \
  --monitor.check_recompute_every=3
grep -q 'step 6: rank 0: the recomputed forward of unit layers.0 differs' "$work/recompute.log" \
  || fail "recompute: mismatch not reported"
record recompute 3 | grep -q '"recompute_check":{"blocks":2,"mismatches":0}' \
  || fail "recompute: a clean check on the GPU failed (a non-deterministic kernel?)"
echo "integration gpu_health: ok"
