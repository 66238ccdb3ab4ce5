#!/usr/bin/env bash
# Context parallelism through the CLI: each sequence split over cp ranks with ring attention
# trains like one rank holding whole sequences (cp = 2, and dp = 2 x cp = 2), at a sequence
# length that needs padding, also with each rank's share of the blocks' inputs offloaded
# (train.activation_offload = inputs) and the MLP in chunks of 7 rows, under full checkpointing;
# metrics.jsonl's trained_tokens counts each step's targets once over the ranks; a cp that does
# not divide the ranks is refused.
# usage: context_parallel.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=40 --model.intermediate_size=72
        --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1
        --model.vocab_size=400 --model.max_position_embeddings=64 --train.seq_len=37
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=4
        --train.steps=8 --train.eval_every=4 --optim.eps=1e-6)

"${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --train.out_dir="$work/one" >/dev/null
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --parallel.cp=2 \
  --train.out_dir="$work/cp2" > "$work/cp2.log"
grep -q "dp 1 x cp 2" "$work/cp2.log" || { echo "FAIL: not cp 2"; cat "$work/cp2.log"; exit 1; }
"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" --train.micro_batch_size=1 --parallel.cp=2 \
  --train.out_dir="$work/dp2cp2" > "$work/dp2cp2.log"
grep -q "dp 2 x cp 2" "$work/dp2cp2.log" || { echo "FAIL: not dp 2 x cp 2"; cat "$work/dp2cp2.log"; exit 1; }
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --parallel.cp=2 \
  --train.activation_checkpointing=full --train.activation_offload=inputs \
  --train.mlp_chunk_tokens=7 --train.out_dir="$work/cp2_offload" > "$work/cp2_offload.log"
grep -q "activation offload: the inputs of 1 blocks (40 tokens x 40 each)" "$work/cp2_offload.log" \
  && grep -q "MLP in chunks of 7 of the 40 rows" "$work/cp2_offload.log" \
  || { echo "FAIL: offload or chunks not reported"; cat "$work/cp2_offload.log"; exit 1; }
for run in cp2 dp2cp2 cp2_offload; do
  rel=$(max_rel "$work/one/metrics.jsonl" "$work/$run/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: $run differs from one rank by $rel"; exit 1; }
  echo "$run vs one rank: largest relative loss difference $rel"
done
# Every step's trained targets, counted once over the dp and cp ranks: 2 windows of 37 targets
# per step, every one trained (no mask in this data).
for run in one cp2 dp2cp2 cp2_offload; do
  counts=$(grep -o '"trained_tokens":[0-9]*' "$work/$run/metrics.jsonl" | cut -d: -f2 | sort | uniq -c)
  [ "$(echo $counts)" = "8 74" ] || { echo "FAIL: $run's trained_tokens per step: $counts"; exit 1; }
done

rc=0
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --parallel.cp=3 --train.out_dir="$work/bad" \
  > "$work/bad.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "parallel.cp': 3 does not divide the 2 ranks" "$work/bad.log" \
  || { echo "FAIL: cp = 3 on 2 ranks was not refused"; cat "$work/bad.log"; exit 1; }
echo "integration context_parallel: ok"
