#!/usr/bin/env bash
# frugal eval --quant: a model whose blocks' linear weights are stored 4-bit (NF4, HQQ)
# evaluates close to the fp32 model; a model whose rows do not split into 64-blocks is
# refused with the tensor named.
# usage: quant.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
root=$2
export OMP_NUM_THREADS=2

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
"$frugal" train --data.dir="$work/data" --model.hidden_size=64 --model.intermediate_size=128 \
  --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2 \
  --model.vocab_size=400 --model.max_position_embeddings=64 --train.seq_len=32 \
  --train.micro_batch_size=4 --train.steps=30 --train.lr=5e-3 --train.sample_tokens=0 \
  --train.out_dir="$work/run" >/dev/null
printf '1 17 200 31 45 9 300 12 7 88 140 2\n1 5 6 7 8 9 10 11 12 13 14 15 16 17\n' > "$work/ids.txt"

loss() { grep -o '"loss":[^,}]*' | cut -d: -f2; }
fp32=$("$frugal" eval --ckpt "$work/run" --tokens "$work/ids.txt" | loss)
for q in nf4 hqq; do
  ql=$("$frugal" eval --ckpt "$work/run" --tokens "$work/ids.txt" --quant=$q | loss)
  # 4-bit weights move the loss a little, not a lot
  awk -v a="$ql" -v b="$fp32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d > 0 && d < 0.05 * b) }' \
    || { echo "FAIL: --quant=$q loss $ql against fp32 $fp32"; exit 1; }
  echo "eval --quant=$q: loss $ql (fp32 $fp32)"
done

rc=0
"$frugal" eval --hf-model "$root/tests/fixtures/hf/gqa_untied" --tokens "$work/ids.txt" --quant=nf4 \
  > "$work/bad.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "down_proj" "$work/bad.log" \
  || { echo "FAIL: rows of 96 were not refused"; cat "$work/bad.log"; exit 1; }
rc=0
"$frugal" eval --ckpt "$work/run" --tokens "$work/ids.txt" --quant=int3 > "$work/bad2.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "not one of none, nf4, hqq" "$work/bad2.log" \
  || { echo "FAIL: --quant=int3 was not refused"; cat "$work/bad2.log"; exit 1; }
echo "integration quant: ok"
