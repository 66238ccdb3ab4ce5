#!/usr/bin/env bash
# Per-layer updates (optim.update = per_layer) end to end on 2 CPU ranks: with clipping off the
# losses equal the ordinary step's bit for bit; a run killed after its step-8 checkpoint resumes
# (previous_norm's state included) with the losses of the run that never stopped; NaN in one
# rank's gradients of layers.0 leaves the step partly applied (the units above it updated,
# layers.0 and the embedding not), counted as a skipped step, and the run goes on; offload is
# refused by name.
# usage: per_layer.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

corpus=/usr/share/games/fortunes/fortunes
[ -f "$corpus" ] || { echo "missing $corpus (tools/install-deps installs fortunes-min)"; exit 1; }
"$frugal" prepare "$corpus" --out "$work/data" --vocab-size 512 >/dev/null

common=(--data.dir="$work/data" --model.hidden_size=48 --model.intermediate_size=96
        --model.num_hidden_layers=2 --model.num_attention_heads=3 --model.num_key_value_heads=1
        --model.vocab_size=512 --model.max_position_embeddings=64 --train.seq_len=32
        --train.micro_batch_size=2 --train.grad_accum_steps=2 --train.lr=5e-3
        --train.warmup_steps=2 --train.eval_batches=4 --train.sample_tokens=0 --train.steps=12
        --ckpt.every=4 --ckpt.async=false)
fail() { echo "FAIL: $*"; exit 1; }
train() {  # train NAME ARGS...: two ranks, the log in $work/NAME.log
  local name=$1
  shift
  "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.out_dir="$work/$name" "$@" \
    > "$work/$name.log" 2>&1 || { tail -n 20 "$work/$name.log"; fail "$name: frugal train failed"; }
}

# Clipping off: the same weights after every step, so the same losses.
train step --optim.grad_clip=0
train layer --optim.grad_clip=0 --optim.update=per_layer
cmp <(losses "$work/step/metrics.jsonl") <(losses "$work/layer/metrics.jsonl") \
  || fail "per-layer updates changed the losses of the ordinary step"
echo "per_layer, clipping off: the ordinary step's losses bit for bit"

# Resume: killed at step 9, back from step 8's checkpoint.
clip=(--optim.update=per_layer --optim.per_layer_clip=previous_norm --optim.grad_clip=0.3)
train through "${clip[@]}"
rc=0
FRUGAL_INJECT_FAULT=exit:1:9 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${clip[@]}" \
  --train.out_dir="$work/killed" > "$work/killed.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "the injected exit did not stop the run"
[ "$(cat "$work/killed/ckpt/LATEST")" = step_00000008 ] || fail "no step-8 checkpoint"
train killed "${clip[@]}" --train.resume=true
grep -q "resumed from step 8" "$work/killed.log" || fail "no resume"
cmp <(losses "$work/through/metrics.jsonl") <(losses "$work/killed/metrics.jsonl") \
  || fail "the resumed losses differ from the run that never stopped"
echo "per_layer, previous_norm: resumed with the losses of the run that never stopped"

# NaN in rank 1's layers.0 gradients at step 7: the head and layers.1 were updated before.
FRUGAL_INJECT_FAULT=nan:1:7 train nan --optim.update=per_layer
grep -q 'step 7: per-layer updates: 2 of 4 units were updated before unit 1' "$work/nan.log" \
  || fail "nan: no partly-applied warning: $(grep 'step 7' "$work/nan.log")"
r=$(grep '"step":7,' "$work/nan/metrics.jsonl" | grep '"loss"')
grep -q '"partly_applied":{"units":4,"units_updated":2}' <<< "$r" || fail "nan: step 7's record: $r"
grep -q '"skipped":true' <<< "$r" || fail "nan: step 7 not counted as skipped"
grep -q 'steps skipped (non-finite gradients)  *1$' "$work/nan.log" || fail "nan: not counted"
grep -q '"step":12,' "$work/nan/metrics.jsonl" || fail "nan: the run did not go on"

# Offload is refused by name.
rc=0
"$frugal" train "${common[@]}" --optim.update=per_layer --parallel.offload=optimizer \
  --train.out_dir="$work/off" > "$work/off.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "config key 'optim.update': per_layer works without offload" "$work/off.log" \
  || fail "offload: $(cat "$work/off.log")"
echo "per_layer: all checks passed"
