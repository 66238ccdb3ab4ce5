#!/usr/bin/env bash
# The health monitor and its guards end to end on the CPU backend, each injected fault
# (FRUGAL_INJECT_FAULT) detected and handled as configured: NaN in one rank's gradients (the
# step skipped, the unit named), a loss spike (warn, skip_batch, rollback), a slow rank (named),
# a bit flip in a replicated tensor (named; rollback restores it), a non-deterministic recompute
# (rank and unit named); and a run rolled back after an injected divergence ends within 1 % of
# a clean run's final validation loss.
# usage: health.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

corpus=/usr/share/games/fortunes/fortunes
[ -f "$corpus" ] || { echo "missing $corpus (tools/install-deps installs fortunes-min)"; exit 1; }
"$frugal" prepare "$corpus" --out "$work/data" --vocab-size 512 >/dev/null

common=(--data.dir="$work/data" --model.hidden_size=48 --model.intermediate_size=96
        --model.num_hidden_layers=2 --model.num_attention_heads=3 --model.num_key_value_heads=1
        --model.vocab_size=512 --model.max_position_embeddings=64 --train.seq_len=32
        --train.micro_batch_size=4 --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=4
        --train.sample_tokens=0 --monitor.log_every=5 --ckpt.every=5 --ckpt.async=false)
fail() { echo "FAIL: $*"; exit 1; }
# train NAME FAULT ARGS...: two ranks, the log in $work/NAME.log, the run in $work/NAME.
train() {
  local name=$1 fault=$2
  shift 2
  FRUGAL_INJECT_FAULT=$fault "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" \
    --train.out_dir="$work/$name" "$@" > "$work/$name.log" 2>&1 \
    || { tail -n 20 "$work/$name.log"; fail "$name: frugal train failed"; }
}
record() { grep "\"step\":$2," "$work/$1/metrics.jsonl" | grep '"loss"'; }
final_val() { grep -o '"val_loss":[^,}]*' "$work/$1/metrics.jsonl" | tail -1 | cut -d: -f2; }

# A clean run: the health member on log steps, with every unit, the bf16 rates, both ranks.
train clean "" --train.steps=80
r=$(record clean 10)
for part in '"health"' '"layers.1":{"norm"' '"bf16_grad":{"overflow":0' '"busy_seconds":\[' '"slowest":'; do
  grep -q "$part" <<< "$r" || fail "clean: step 10's record lacks $part"
done
record clean 11 | grep -q '"health"' && fail "clean: a health member off the log steps"
grep -q '^  rollbacks  *0$' "$work/clean.log" || fail "clean: no summary table"

# NaN in rank 1's gradients at step 7: skipped, counted, layers.0 named; the run goes on.
train nan nan:1:7 --train.steps=12
grep -q 'step 7: .*non-finite gradient values, the first in unit layers.0; the step is skipped' "$work/nan.log" \
  || fail "nan: no warning naming layers.0"
r=$(record nan 7)
grep -q '"skipped":true' <<< "$r" && grep -q '"first_nonfinite_unit":"layers.0"' <<< "$r" \
  || fail "nan: step 7's record: $r"
grep -q 'steps skipped (non-finite gradients)  *1$' "$work/nan.log" || fail "nan: not counted"
# On a step line (the last step always has one) a NaN norm reads "nan", never printf's "-nan"
# (which the default NaN of x86 arithmetic, sign bit set, printed: here from weights gone inf).
train nanlast "" --train.steps=4 --train.lr=1e30 --train.warmup_steps=0
grep -q '^step 4/4 | .* | grad nan | ' "$work/nanlast.log" || fail "nanlast: $(grep '^step 4/4' "$work/nanlast.log")"

# A loss spike (rank 0's update of step 22 at 1000 x the LR): warn goes on, skip_batch drops it.
train warn spike:0:22 --train.steps=30 --monitor.on_divergence=warn
grep -q 'step 23: loss .* is a spike (z = ' "$work/warn.log" || fail "warn: spike not reported"
train skip spike:0:22 --train.steps=30 --monitor.on_divergence=skip_batch
grep -q 'step 23: loss .* is a spike .*; its batch is skipped' "$work/skip.log" || fail "skip_batch: no skip"
record skip 23 | grep -q '"verdict":"skipped_spike"' || fail "skip_batch: step 23 not marked"

# Rollback: back to step 20 (the newest checkpoint before the damaging update of step 22), the
# LR halved for 10 steps, step 23's batch skipped; the final loss within 1 % of the clean run's.
train rollback spike:0:22 --train.steps=80 --monitor.on_divergence=rollback --monitor.rollback_lr_steps=10
grep -q 'step 23: .*rolled back to step 20, the learning rate x0.5 up to step 30' "$work/rollback.log" \
  || fail "rollback: no rollback to step 20"
grep -q '"rollback":{"from_step":23' "$work/rollback/metrics.jsonl" || fail "rollback: not in metrics.jsonl"
[ "$(grep -c '"loss"' "$work/rollback/metrics.jsonl")" -eq 80 ] || fail "rollback: steps repeated in metrics.jsonl"
clean_val=$(final_val clean) rolled_val=$(final_val rollback)
awk -v a="$clean_val" -v b="$rolled_val" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d < 0.01) }' \
  || fail "rollback: final val_loss $rolled_val is not within 1 % of the clean run's $clean_val"
echo "rollback: final val_loss $rolled_val, clean $clean_val"
expect_error() {
  local what=$1 message=$2
  shift 2
  local out
  out=$("$@" 2>&1) && fail "$what: expected a failure"
  grep -q -- "$message" <<< "$out" || { echo "$out" | tail -3; fail "$what: no '$message'"; }
}
expect_error rollback-without-ckpt "rollback reloads the last checkpoint" \
  "$frugal" train "${common[@]}" --train.steps=3 --ckpt.every=0 --monitor.on_divergence=rollback \
  --train.out_dir="$work/never"

# A slow rank (rank 1 sleeps 0.2 s a step from step 3): named on the log steps.
train slow slow:1:3 --train.steps=10
grep -q 'step 10: rank 1 is slow: busy' "$work/slow.log" || fail "slow: rank 1 not named"
record slow 10 | grep -q '"slow":true,"slowest":1' || fail "slow: not in the record"

# A non-deterministic recompute in rank 1's layers.0 at step 6 (full checkpointing).
train recompute recompute:1:6 --train.steps=8 --train.activation_checkpointing=full \
  --monitor.check_recompute_every=3
grep -q 'step 6: rank 1: the recomputed forward of unit layers.0 differs' "$work/recompute.log" \
  || fail "recompute: mismatch not reported"
record recompute 6 | grep -q '"where":\[{"rank":1,"unit":"layers.0"}\]' || fail "recompute: not in the record"
record recompute 3 | grep -q '"recompute_check":{"blocks":4,"mismatches":0}' || fail "recompute: a clean check failed"

# A bit flip in a replicated tensor (GaLore's right projector) on rank 1: named at the next
# check; with rollback, the checkpoint restores it and the later checks pass.
galore=(--optim.type=galore_adamw --galore.rank=4 --galore.update_proj_gap=5 --monitor.check_replicas_every=3)
train flip bitflip:1:6 --train.steps=10 "${galore[@]}"
grep -q "step 6: replicated tensor 'optim/galore/projector/.*' differs on rank 1" "$work/flip.log" \
  || fail "bitflip: not detected"
train flip-rollback bitflip:1:6 --train.steps=12 "${galore[@]}" --monitor.on_divergence=rollback
grep -q 'step 6: replicated state differs across ranks; rolled back to step 5' "$work/flip-rollback.log" \
  || fail "bitflip: no rollback"
record flip-rollback 12 | grep -q '"replica_check":{"mismatches":\[\]' || fail "bitflip: still differs after the rollback"
# frugal plot: four PNGs of the clean run; without gnuplot, an error that says so.
if command -v gnuplot >/dev/null; then
  "$frugal" plot "$work/clean" > "$work/plot.out" 2>&1 || { cat "$work/plot.out"; fail "plot failed"; }
  for png in loss throughput memory health; do
    [ -s "$work/clean/plots/$png.png" ] || fail "plot: no $png.png"
    head -c 8 "$work/clean/plots/$png.png" | od -An -c | grep -q 'P   N   G' || fail "plot: $png.png is no PNG"
  done
  # Only orted (MPI's start-up) on PATH: no gnuplot.
  mkdir -p "$work/bin" && ln -s "$(command -v orted)" "$work/bin/orted"
  out=$(PATH="$work/bin" OMPI_MCA_plm_rsh_agent=/bin/false "$frugal_binary" plot "$work/clean" 2>&1) \
    && fail "plot without gnuplot: expected a failure"
  grep -q "gnuplot is not installed" <<< "$out" || fail "plot without gnuplot: $out"
else
  echo "no gnuplot here: frugal plot not tested (tools/install-deps installs it)"
fi
echo "integration health: ok"
