#!/usr/bin/env bash
# QLoRA and HQQ-LoRA on the GPU through the CLI: the 4-bit base is dequantized on the GPU and
# the adapters train as on the CPU backend (bf16 tolerance); offloading the optimizer state or
# the parameters (the 4-bit rows included, uploaded per unit) changes no loss, on 1 and 2 GPUs,
# and offload=params keeps the base out of device memory.
# Skips itself (exit 0, with a message) on a machine without a GPU.
# usage: gpu_qlora.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
require_gpu "$2"
export OMP_NUM_THREADS=2
gpu=("$frugal_binary" train --parallel.device=cuda)

"$frugal_binary" prepare "$corpus" --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=256 --model.intermediate_size=640
        --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2
        --model.vocab_size=403 --model.max_position_embeddings=128 --train.seq_len=100
        --train.micro_batch_size=8 --train.warmup_steps=3 --train.eval_batches=4
        --train.sample_tokens=0 --optim.eps=1e-6)
# A base trained briefly on the CPU and exported: the adapters start from a real model.
"$frugal" train "${common[@]}" --train.steps=30 --train.lr=3e-3 --train.eval_every=30 \
  --train.out_dir="$work/base" >/dev/null
"$frugal" export --ckpt "$work/base" --out "$work/hf" >/dev/null
adapters=(--model.hf_path="$work/hf" --lora.rank=8 --lora.alpha=16 --train.lr=1e-2
          --train.steps=20 --train.eval_every=10)
peak() { grep -o '"device_peak_bytes":[0-9]*' "$1" | tail -n 1 | cut -d: -f2; }

for type in qlora hqq_lora; do
  "${gpu[@]}" "${common[@]}" "${adapters[@]}" --train.type=$type --train.out_dir="$work/$type" \
    > "$work/$type.log"
  grep -q "GPU (bf16 compute" "$work/$type.log" || { echo "FAIL: not on the GPU"; cat "$work/$type.log"; exit 1; }
  "$frugal" train "${common[@]}" "${adapters[@]}" --train.type=$type --train.out_dir="$work/$type-cpu" >/dev/null
  rel=$(max_rel "$work/$type/metrics.jsonl" "$work/$type-cpu/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 3e-2) }' || { echo "FAIL: $type GPU vs CPU differs by $rel"; exit 1; }
  vals=$(grep -o '"val_loss":[^,}]*' "$work/$type/metrics.jsonl" | cut -d: -f2)
  start=$(echo "$vals" | head -n 1); end=$(echo "$vals" | tail -n 1)
  awk -v a="$start" -v b="$end" 'BEGIN { exit !(b < a - 0.02) }' \
    || { echo "FAIL: $type on the GPU: validation loss $start -> $end"; exit 1; }
  echo "$type on the GPU: validation loss $start -> $end; against the CPU backend $rel"
  for mode in optimizer params; do
    "${gpu[@]}" "${common[@]}" "${adapters[@]}" --train.type=$type --parallel.offload=$mode \
      --train.out_dir="$work/$type-$mode" > "$work/off.log"
    rel=$(max_rel "$work/$type/metrics.jsonl" "$work/$type-$mode/metrics.jsonl")
    awk -v r="$rel" 'BEGIN { exit !(r < 1e-6) }' || { echo "FAIL: $type offload=$mode differs by $rel"; exit 1; }
    echo "$type offload=$mode: largest relative loss difference $rel, peak $(peak "$work/$type-$mode/metrics.jsonl") B"
  done
  a=$(peak "$work/$type/metrics.jsonl"); b=$(peak "$work/$type-params/metrics.jsonl")
  [ "$b" -lt "$a" ] || { echo "FAIL: $type offload=params peaks at $b B, not below $a B"; exit 1; }
done

if [ "$gpus" -ge 2 ]; then
  for mode in none params; do
    "${mpi[@]}" -np 2 -x OMP_NUM_THREADS -x LD_LIBRARY_PATH "${gpu[@]}" "${common[@]}" "${adapters[@]}" \
      --train.type=qlora --train.micro_batch_size=4 --parallel.offload=$mode \
      --train.out_dir="$work/two-$mode" > "$work/two.log"
    rel=$(max_rel "$work/qlora/metrics.jsonl" "$work/two-$mode/metrics.jsonl")
    awk -v r="$rel" 'BEGIN { exit !(r < 1e-2) }' || { echo "FAIL: qlora on 2 GPUs (offload=$mode) differs by $rel"; exit 1; }
    echo "qlora on 2 GPUs, offload=$mode vs 1 GPU: largest relative loss difference $rel"
  done
else
  echo "one GPU: the 2-GPU comparison is skipped"
fi
