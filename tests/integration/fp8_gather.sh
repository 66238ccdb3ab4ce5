#!/usr/bin/env bash
# FP8 weight gathers through the CLI on the CPU backend (which emulates FP8 bit for bit): on 1, 2
# and 4 ranks, FP8 training with the trained projections gathered as E4M3 bytes
# (fp8.gather_weights = true) gives the same losses, bit for bit, as with them gathered as they
# are (the same codes: each rank casts its rows with the agreed scale, the cast is elementwise),
# and the multi-rank runs equal one rank within what ZeRO-3's other summation order allows.
# metrics.jsonl's link_bytes drop by exactly what the shapes say: every projection gathered at
# 1 byte a weight instead of 4 (the CPU gathers fp32 shards; a GPU gathers bf16, 2).
# usage: fp8_gather.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
# Projections: q, o [40, 40]; k, v [8, 40]; gate, up [72, 40]; down [40, 72]; 2 blocks.
hidden=40 inter=72 kv=8 layers=2
common=(--data.dir="$work/data" --model.hidden_size=$hidden --model.intermediate_size=$inter
        --model.num_hidden_layers=$layers --model.num_attention_heads=5
        --model.num_key_value_heads=1 --model.vocab_size=403 --model.max_position_embeddings=64
        --train.seq_len=24 --train.micro_batch_size=4 --train.lr=5e-3 --train.warmup_steps=2
        --train.eval_batches=2 --train.sample_tokens=0 --train.steps=8 --train.eval_every=4
        --optim.eps=1e-6 --fp8.enabled=true --ckpt.final=false)
# link_bytes within the node of the last step record (rank 0's)
intra_bytes() { grep -o '"intra_node":[0-9]*' "$1" | tail -1 | cut -d: -f2; }
val_losses() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }

# The bytes a step's projection gathers receive on one of n ranks at b bytes a weight: every
# block is gathered twice (forward, backward), each projection [rows, cols] as n shards of
# ceil(rows / n) rows, of which a rank receives n - 1 (link_traffic.h's ring count).
gather_bytes() {  # n b
  awk -v n="$1" -v b="$2" -v h=$hidden -v i=$inter -v kv=$kv -v L=$layers 'BEGIN {
    split(h " " h " " kv " " h " " kv " " h " " h " " h " " i " " h " " i " " h " " h " " i, d, " ")
    for (p = 1; p <= 14; p += 2) { rows = d[p]; cols = d[p + 1]
      shard = int((rows + n - 1) / n); s += (n - 1) * shard * cols }
    printf "%d\n", 2 * L * s * b }'
}

for n in 1 2 4; do
  mb=$((4 / n))
  for g in true false; do
    "${mpi[@]}" -np $n "$frugal" train "${common[@]}" --train.micro_batch_size=$mb \
      --fp8.gather_weights=$g --train.out_dir="$work/n$n-$g" > /dev/null
  done
  # Bit for bit: the printed losses (shortest round trip of each double) are the same strings.
  if ! diff <(losses "$work/n$n-true/metrics.jsonl"; val_losses "$work/n$n-true/metrics.jsonl") \
            <(losses "$work/n$n-false/metrics.jsonl"; val_losses "$work/n$n-false/metrics.jsonl") >/dev/null; then
    echo "FAIL: $n rank(s): FP8 gathers change the losses by $(max_rel "$work/n$n-true/metrics.jsonl" "$work/n$n-false/metrics.jsonl")"
    exit 1
  fi
  echo "$n rank(s): losses with FP8 weight gathers equal those without, bit for bit"
  if [ $n -gt 1 ]; then
    rel=$(max_rel "$work/n1-true/metrics.jsonl" "$work/n$n-true/metrics.jsonl")
    awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: $n ranks differ from one by $rel"; exit 1; }
    echo "$n ranks with FP8 gathers vs one rank: largest relative loss difference $rel"
    on=$(intra_bytes "$work/n$n-true/metrics.jsonl")
    off=$(intra_bytes "$work/n$n-false/metrics.jsonl")
    fp32=$(gather_bytes $n 4) fp8=$(gather_bytes $n 1) bf16=$(gather_bytes $n 2)
    [ $((off - on)) -eq $((fp32 - fp8)) ] \
      || { echo "FAIL: $n ranks: link bytes $off -> $on, expected a drop of $((fp32 - fp8))"; exit 1; }
    echo "$n ranks: projection gathers $fp8 bytes a step as FP8 (fp32 $fp32, bf16 $bf16);" \
         "all link bytes $off -> $on"
  fi
done

# One rank keeps each weight's codes for the step, cast at its first gather: the backward's
# gathers, full checkpointing's recomputing forward and the second micro-batch read them instead
# of casting again, and the next step casts anew (a stale code would change the losses).
for g in true false; do
  "${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.micro_batch_size=2 \
    --train.grad_accum_steps=2 --train.activation_checkpointing=full --fp8.gather_weights=$g \
    --train.out_dir="$work/accum-$g" > "$work/accum-$g.log" 2>&1
done
if ! diff <(losses "$work/accum-true/metrics.jsonl"; val_losses "$work/accum-true/metrics.jsonl") \
          <(losses "$work/accum-false/metrics.jsonl"; val_losses "$work/accum-false/metrics.jsonl") >/dev/null; then
  echo "FAIL: one rank, 2 micro-batches, full checkpointing: kept FP8 codes change the losses"
  exit 1
fi
# The plan counts them: the seven projections of 2 blocks, 24,960 bytes (0.02 MiB).
grep -q 'FP8 weight codes of the step 0.02 MiB' "$work/accum-true.log" \
  || { echo "FAIL: the memory plan does not count the kept FP8 codes"; grep 'memory plan' "$work/accum-true.log"; exit 1; }
echo "one rank, 2 micro-batches, full checkpointing: kept FP8 codes, losses equal bit for bit"

# Evaluation reads the weights as they are: the validation losses equal those without FP8
# gathers (checked above) and the switch back after each step holds.
echo "integration fp8_gather: ok"
