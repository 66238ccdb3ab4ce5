#!/usr/bin/env bash
# FP8 training on the GPU through the CLI ([fp8] enabled): it learns, stays within a few percent
# of the bf16 run and of the CPU backend's FP8 emulation, writes per-layer underflow/overflow
# rates, gathers its trained weights as FP8 with the same losses as without (and, on 2 GPUs,
# half the bytes), resumes a killed run exactly (the delayed scales are checkpointed), trains a LoRA base
# gathered as FP8 and QLoRA/HQQ bases decoded straight to E4M3, and refuses a shape cuBLASLt's FP8 GEMMs cannot take, naming it.
# Skips itself (exit 0, with a message) on a machine without a GPU.
# usage: gpu_fp8.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
require_gpu "$2"
export OMP_NUM_THREADS=2
gpu=("$frugal_binary" train --parallel.device=cuda)

"$frugal_binary" prepare "$corpus" --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=256 --model.intermediate_size=688
        --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2
        --model.vocab_size=403 --model.max_position_embeddings=128 --train.seq_len=100
        --train.micro_batch_size=8 --train.lr=3e-3 --train.warmup_steps=5 --train.eval_batches=4
        --train.sample_tokens=0 --train.steps=40 --train.eval_every=20 --optim.eps=1e-6
        --monitor.log_every=10)
val_losses() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }

"${gpu[@]}" "${common[@]}" --train.out_dir="$work/bf16" > /dev/null
"${gpu[@]}" "${common[@]}" --fp8.enabled=true --train.out_dir="$work/fp8" > "$work/fp8.log"
first=$(val_losses "$work/fp8/metrics.jsonl" | head -n 1)
last=$(val_losses "$work/fp8/metrics.jsonl" | tail -n 1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' \
  || { echo "FAIL: FP8 validation loss $first -> $last"; exit 1; }
bf16_last=$(val_losses "$work/bf16/metrics.jsonl" | tail -n 1)
awk -v a="$bf16_last" -v b="$last" 'BEGIN { d = (b - a) / a; exit !(d < 0.03 && d > -0.03) }' \
  || { echo "FAIL: FP8 final validation loss $last vs bf16 $bf16_last"; exit 1; }
echo "GPU FP8: validation loss $first -> $last (bf16: $bf16_last)"
grep -q '"fp8":{"overflow":{"activation":\[' "$work/fp8/metrics.jsonl" \
  || { echo "FAIL: no FP8 rates in metrics.jsonl"; exit 1; }
[ "$(grep -c '"fp8":' "$work/fp8/metrics.jsonl")" -eq 4 ] \
  || { echo "FAIL: FP8 rates expected every 10 steps"; exit 1; }

# FP8 weight gathers (fp8.gather_weights, on above): one rank gathers nothing, but the provider
# casts each weight once per gather and the backward transposes those codes; the codes are those
# the GEMM's own cast makes, so the losses are the same bit for bit.
"${gpu[@]}" "${common[@]}" --fp8.enabled=true --fp8.gather_weights=false \
  --train.out_dir="$work/fp8-nogather" > /dev/null
diff <(losses "$work/fp8/metrics.jsonl") <(losses "$work/fp8-nogather/metrics.jsonl") >/dev/null \
  || { echo "FAIL: FP8 weight gathers change the GPU losses by $(max_rel "$work/fp8/metrics.jsonl" "$work/fp8-nogather/metrics.jsonl")"; exit 1; }
echo "GPU FP8 weight gathers (one rank): the same losses as without, bit for bit"
# Two GPUs (NCCL): the same losses again, and the projection gathers at 1 byte a weight instead
# of bf16's 2: link_bytes drop by 2 blocks x 2 gathers x sum over projections of
# (N - 1) * ceil(rows / N) * cols.
if [ "$gpus" -ge 2 ]; then
  for g in true false; do
    mpirun --oversubscribe --bind-to none -np 2 "${gpu[@]}" "${common[@]}" --fp8.enabled=true \
      --train.micro_batch_size=4 --train.steps=10 --model.intermediate_size=704 \
      --fp8.gather_weights=$g \
      --train.out_dir="$work/two-$g" > /dev/null
  done
  diff <(losses "$work/two-true/metrics.jsonl") <(losses "$work/two-false/metrics.jsonl") >/dev/null \
    || { echo "FAIL: 2 GPUs: FP8 weight gathers change the losses"; exit 1; }
  on=$(grep -o '"intra_node":[0-9]*' "$work/two-true/metrics.jsonl" | tail -1 | cut -d: -f2)
  off=$(grep -o '"intra_node":[0-9]*' "$work/two-false/metrics.jsonl" | tail -1 | cut -d: -f2)
  # q, o [256, 256]; k, v [128, 256]; gate, up [704, 256]; down [256, 704]: halves of each
  # (intermediate 704, not 688: a GPU's shard must be a multiple of 16 rows to go as FP8).
  per_gather=$(( (128 + 128 + 64 + 64 + 352 + 352) * 256 + 128 * 704 ))
  [ $((off - on)) -eq $((2 * 2 * per_gather)) ] \
    || { echo "FAIL: 2 GPUs: link bytes $off -> $on, expected a drop of $((4 * per_gather))"; exit 1; }
  echo "2 GPUs: FP8 weight gathers bit for bit; projection gathers $((4 * per_gather)) bytes a" \
       "step (bf16: $((8 * per_gather))), all link bytes $off -> $on"
fi

"$frugal" train "${common[@]}" --fp8.enabled=true --train.out_dir="$work/cpu" >/dev/null
rel=$(max_rel "$work/fp8/metrics.jsonl" "$work/cpu/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 5e-2) }' || { echo "FAIL: GPU vs CPU FP8 losses differ by $rel"; exit 1; }
echo "GPU vs CPU FP8: largest relative loss difference $rel"

# Killed after the step-20 checkpoint, resumed: the same losses as the straight run.
rc=0
FRUGAL_INJECT_FAULT=exit:0:21 "${gpu[@]}" "${common[@]}" --fp8.enabled=true --ckpt.async=false \
  --ckpt.every=20 --train.out_dir="$work/re" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
"${gpu[@]}" "${common[@]}" --fp8.enabled=true --ckpt.every=20 --train.resume=true \
  --train.out_dir="$work/re" > "$work/re.log"
grep -q "resumed from step 20" "$work/re.log" || { echo "FAIL: no resume"; cat "$work/re.log"; exit 1; }
rel=$(max_rel "$work/fp8/metrics.jsonl" "$work/re/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 1e-6) }' || { echo "FAIL: resumed FP8 run differs by $rel"; exit 1; }
echo "GPU FP8 resume: largest relative loss difference $rel"

# LoRA with FP8: the base projections are stored and gathered as E4M3.
"${gpu[@]}" "${common[@]}" --fp8.enabled=true --train.type=lora --train.out_dir="$work/lora" \
  > /dev/null || { echo "FAIL: LoRA with FP8"; exit 1; }
echo "GPU FP8 LoRA: final validation $(val_losses "$work/lora/metrics.jsonl" | tail -n 1)"

# QLoRA and HQQ-LoRA with FP8: the 4-bit base is decoded straight to E4M3 (no bf16 copy; the
# kernels' codes equal the cast of the bf16 dequantization bit for bit: gpu_test_cuda_quant).
# They learn, and stay within a few percent of the CPU backend's FP8 emulation (intermediate
# 704: NF4 and HQQ rows are multiples of 64).
for type in qlora hqq_lora; do
  "${gpu[@]}" "${common[@]}" --fp8.enabled=true --train.type=$type --train.lr=1e-2 --model.intermediate_size=704 \
    --train.out_dir="$work/$type" > /dev/null || { echo "FAIL: $type with FP8"; exit 1; }
  "$frugal" train "${common[@]}" --fp8.enabled=true --train.type=$type --train.lr=1e-2 --model.intermediate_size=704 \
    --train.out_dir="$work/$type-cpu" > /dev/null || { echo "FAIL: $type with FP8 on the CPU"; exit 1; }
  first=$(val_losses "$work/$type/metrics.jsonl" | head -n 1)
  last=$(val_losses "$work/$type/metrics.jsonl" | tail -n 1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.95 * a) }' \
    || { echo "FAIL: $type with FP8: validation loss $first -> $last"; exit 1; }
  rel=$(max_rel "$work/$type/metrics.jsonl" "$work/$type-cpu/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 5e-2) }' \
    || { echo "FAIL: $type with FP8: GPU vs CPU losses differ by $rel"; exit 1; }
  echo "GPU FP8 $type: validation loss $first -> $last; GPU vs CPU largest relative loss difference $rel"
done

# A shape the FP8 GEMMs cannot take: named before any step.
rc=0
"${gpu[@]}" "${common[@]}" --fp8.enabled=true --model.intermediate_size=680 \
  --train.out_dir="$work/bad" > "$work/bad.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "model.intermediate_size = 680 to be a multiple of 16" "$work/bad.log" \
  || { echo "FAIL: a shape FP8 cannot take was not refused by name"; cat "$work/bad.log"; exit 1; }
echo "integration gpu_fp8: ok"
