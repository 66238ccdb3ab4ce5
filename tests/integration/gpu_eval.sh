#!/usr/bin/env bash
# eval and generate on GPUs: the loss of every Hugging Face fixture (rotary scaling types and
# Qwen2's biases included) within bf16 tolerance of transformers' fp32 loss, the greedy continuation of the
# fixtures whose margins bf16 keeps, 2 GPUs (weights sharded) like 1, and NF4 on the GPU like
# NF4 on the CPU. Skips itself (exit 0, with a message) on a machine without a GPU.
# usage: gpu_eval.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
require_gpu "$2"
fixtures=$2/tests/fixtures/hf
export OMP_NUM_THREADS=2
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
expected() { grep "\"$2\":" "$fixtures/$1/expected.json" | sed -e 's/^[^:]*: *//' -e 's/,$//' | tr -d '[],'; }
loss_of() { grep -o '"loss":[^,}]*' <<< "$1" | cut -d: -f2; }
close() {  # close A B TOLERANCE: |A - B| / B < TOLERANCE
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d / b < t) }'
}

for model in gqa_untied mha_tied_sharded rope_linear rope_dynamic rope_yarn rope_llama3 qwen2_gqa mistral_window; do
  dir=$fixtures/$model
  gpu=$("$frugal_binary" eval --hf-model "$dir" --tokens "$dir/tokens.txt" --device cuda)
  want=$(expected "$model" loss)
  close "$(loss_of "$gpu")" "$want" 3e-2 \
    || { echo "FAIL: $model on the GPU: $gpu, transformers $want"; exit 1; }
  echo "$model: GPU loss $(loss_of "$gpu"), transformers (fp32) $want"
  if [ "$gpus" -ge 2 ]; then
    two=$(mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS -x LD_LIBRARY_PATH \
          ${NCCL_NVLS_ENABLE+-x NCCL_NVLS_ENABLE} "$frugal_binary" eval \
          --hf-model "$dir" --tokens "$dir/tokens.txt" --device cuda)
    close "$(loss_of "$two")" "$(loss_of "$gpu")" 1e-3 \
      || { echo "FAIL: $model on 2 GPUs: $two, one GPU: $gpu"; exit 1; }
  fi
done

# Greedy on the GPU (bf16): the first 8 continuation tokens, whose top-2 logit margins are
# 0.12 or more (fp32), well above bf16 rounding.
dir=$fixtures/gqa_untied
prompt=$(expected gqa_untied prompt)
want=$(expected gqa_untied greedy | cut -d' ' -f1-13)
out=$("$frugal_binary" generate --hf-model "$dir" --prompt-ids "$prompt" --ids --max-new-tokens 8 --device cuda)
[ "$out" = "$want" ] || { echo "FAIL: GPU greedy $out, transformers $want"; exit 1; }
echo "GPU greedy: $out"

# NF4 storage: the GPU's loss near the CPU's (the same 4-bit weights, bf16 compute).
"$frugal" prepare "$corpus" --out "$work/data" --vocab-size 400 >/dev/null
"$frugal" train --data.dir="$work/data" --model.hidden_size=128 --model.intermediate_size=256 \
  --model.num_hidden_layers=2 --model.num_attention_heads=2 --model.num_key_value_heads=1 \
  --model.vocab_size=400 --model.max_position_embeddings=64 --train.seq_len=64 --train.steps=5 \
  --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 \
  --train.out_dir="$work/run" >/dev/null 2>&1
args=(eval --ckpt "$work/run" --token-file "$work/data/val.tok" --seq-len 64 --max-sequences 8 --quant nf4)
cpu=$("$frugal_binary" "${args[@]}" --device cpu)
gpu=$("$frugal_binary" "${args[@]}" --device cuda)
close "$(loss_of "$gpu")" "$(loss_of "$cpu")" 3e-2 || { echo "FAIL: NF4 GPU $gpu, CPU $cpu"; exit 1; }
echo "NF4: GPU $(loss_of "$gpu"), CPU $(loss_of "$cpu")"
echo "integration gpu_eval: ok"
