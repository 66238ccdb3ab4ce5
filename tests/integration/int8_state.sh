#!/usr/bin/env bash
# optim.state_dtype = int8 through the CLI on a tiny CPU model whose matrices have 4096 values or
# more (so their moments are 8-bit; the norms keep 32-bit ones): AdamW and GaLore train (the
# loss goes down), a run killed after its step-8 checkpoint resumes with the losses of the run
# that never stopped, bit for bit, on 1 rank and on 2; a 2-rank checkpoint resumes on 1 rank
# (the 8-bit codes and scales are resharded by rows like the weights); the log names the state;
# and the combination of issue 52's 7B run (bf16 masters, int8, GaLore, per-layer) trains and
# resumes exactly.
# usage: int8_state.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=64 --model.intermediate_size=128
        --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=4
        --train.steps=16 --train.eval_every=8 --ckpt.every=8 --ckpt.async=false
        --optim.state_dtype=int8)

for optimizer in adamw galore_adamw; do
  opts=(--optim.type=$optimizer)
  # GaLore at rank 32: the MLP's projected moments are [128, 32] and [32, 128], 8-bit.
  [ $optimizer = galore_adamw ] && opts+=(--galore.rank=32 --galore.update_proj_gap=5)
  for ranks in 1 2; do
    straight=$work/$optimizer-$ranks
    "${mpi[@]}" -np $ranks "$frugal" train "${common[@]}" "${opts[@]}" \
      --train.micro_batch_size=$((4 / ranks)) --train.out_dir="$straight" > "$straight.log"
    first=$(losses "$straight/metrics.jsonl" | head -1)
    last=$(losses "$straight/metrics.jsonl" | tail -1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' \
      || { echo "FAIL: $optimizer int8 on $ranks rank(s): the loss went from $first to $last"; exit 1; }
    echo "$optimizer int8, $ranks rank(s): loss $first -> $last"
    grep -q "8-bit moments (optim.state_dtype = int8)" "$straight.log" \
      || { echo "FAIL: the log does not say the moments are 8-bit"; cat "$straight.log"; exit 1; }
    if [ $ranks -eq 1 ]; then
      # The optimizer's state against the same run's in fp32: the matrices' moments at a byte a
      # value and a scale a block of 256, the norms' in fp32.
      "$frugal" train "${common[@]}" "${opts[@]}" --optim.state_dtype=fp32 --train.steps=1 \
        --train.micro_batch_size=4 --train.out_dir="$straight-fp32" > /dev/null
      int8_bytes=$(grep -o '"optimizer_bytes":[0-9]*' "$straight/metrics.jsonl" | head -1 | cut -d: -f2)
      fp32_bytes=$(grep -o '"optimizer_bytes":[0-9]*' "$straight-fp32/metrics.jsonl" | head -1 | cut -d: -f2)
      awk -v a="$int8_bytes" -v b="$fp32_bytes" 'BEGIN { exit !(a < b / 2) }' \
        || { echo "FAIL: $optimizer optimizer state $int8_bytes bytes in int8, $fp32_bytes in fp32"; exit 1; }
      echo "$optimizer optimizer state: $int8_bytes bytes with int8, $fp32_bytes with fp32"
    fi
    dir=$work/$optimizer-$ranks-killed
    rc=0
    FRUGAL_INJECT_FAULT=exit:0:9 "${mpi[@]}" -np $ranks "$frugal" train "${common[@]}" "${opts[@]}" \
      --train.micro_batch_size=$((4 / ranks)) --train.out_dir="$dir" >/dev/null 2>&1 || rc=$?
    [ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
    [ "$(cat "$dir/ckpt/LATEST")" = step_00000008 ] || { echo "FAIL: no step-8 checkpoint"; exit 1; }
    cp -r "$dir" "$dir-copy"
    "${mpi[@]}" -np $ranks "$frugal" train "${common[@]}" "${opts[@]}" --train.resume=true \
      --train.micro_batch_size=$((4 / ranks)) --train.out_dir="$dir" > "$dir.log"
    grep -q "resumed from step 8" "$dir.log" || { echo "FAIL: no resume"; cat "$dir.log"; exit 1; }
    cmp <(losses "$straight/metrics.jsonl") <(losses "$dir/metrics.jsonl") \
      || { echo "FAIL: $optimizer int8 resumed on $ranks rank(s) differs from the run that never stopped"; exit 1; }
    echo "$optimizer int8, $ranks rank(s): resumed with the same losses"
    if [ $ranks -eq 2 ]; then
      # The 2-rank checkpoint on 1 rank: trains on as the 2 ranks did, to the rounding of the
      # gradient sums (which may move a code to its neighbour).
      "$frugal" train "${common[@]}" "${opts[@]}" --train.resume=true --train.micro_batch_size=4 \
        --train.out_dir="$dir-copy" > "$dir-copy.log"
      grep -q "resumed from step 8" "$dir-copy.log" || { echo "FAIL: no resume on 1 rank"; cat "$dir-copy.log"; exit 1; }
      rel=$(max_rel "$straight/metrics.jsonl" "$dir-copy/metrics.jsonl")
      awk -v r="$rel" 'BEGIN { exit !(r < 1e-3) }' || { echo "FAIL: 2->1 rank resume differs by $rel"; exit 1; }
      echo "$optimizer int8: a 2-rank checkpoint resumed on 1 rank, largest relative loss difference $rel"
    fi
  done
done

# The 7B run's combination (issue 52): bf16 master weights rounded stochastically, 8-bit moments,
# GaLore, per-layer updates, on 2 ranks: it trains, and a run killed after its step-8 checkpoint
# resumes with the losses of the run that never stopped, bit for bit (the rounding's bits are a
# function of the step and the element, not of the run's history).
combo=(--optim.type=galore_adamw --galore.rank=32 --galore.update_proj_gap=5
       --galore.refresh=inline --optim.master_dtype=bf16 --optim.update=per_layer
       --train.micro_batch_size=2)
straight=$work/combo
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${combo[@]}" --train.out_dir="$straight" > "$straight.log"
grep -q "bf16 master weights and gradients (rounded stochastic), 8-bit moments" "$straight.log" \
  || { echo "FAIL: the log does not name the combination"; cat "$straight.log"; exit 1; }
first=$(losses "$straight/metrics.jsonl" | head -1)
last=$(losses "$straight/metrics.jsonl" | tail -1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' \
  || { echo "FAIL: bf16 masters + int8 + GaLore + per-layer: the loss went from $first to $last"; exit 1; }
dir=$work/combo-killed
rc=0
FRUGAL_INJECT_FAULT=exit:0:9 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${combo[@]}" \
  --train.out_dir="$dir" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the combined run"; exit 1; }
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${combo[@]}" --train.resume=true \
  --train.out_dir="$dir" > "$dir.log"
grep -q "resumed from step 8" "$dir.log" || { echo "FAIL: no resume"; cat "$dir.log"; exit 1; }
cmp <(losses "$straight/metrics.jsonl") <(losses "$dir/metrics.jsonl") \
  || { echo "FAIL: the combined run resumed differs from the run that never stopped"; exit 1; }
echo "bf16 masters + int8 + GaLore + per-layer, 2 ranks: loss $first -> $last, resumed with the same losses"
# A checkpoint of fp32 moments resumed with optim.state_dtype = int8 (and the reverse) is refused,
# naming the key, not read as a damaged checkpoint.
rc=0
"$frugal" train "${common[@]}" --optim.state_dtype=fp32 --train.micro_batch_size=4 --train.steps=8 \
  --train.out_dir="$work/fp32-ckpt" >/dev/null
"$frugal" train "${common[@]}" --train.micro_batch_size=4 --train.resume=true \
  --train.out_dir="$work/fp32-ckpt" > "$work/mixed.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: an fp32 checkpoint resumed with int8 moments"; exit 1; }
grep -q "holds fp32 optimizer moments (optim.state_dtype = fp32) and this run asks for optim.state_dtype = int8" \
  "$work/mixed.log" || { echo "FAIL: the refusal does not name the key"; cat "$work/mixed.log"; exit 1; }
echo "an fp32 checkpoint resumed with optim.state_dtype = int8: refused, naming the key"
echo "integration int8_state: ok"
