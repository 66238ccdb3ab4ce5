#!/usr/bin/env bash
# eval and generate on several ranks, the weights sharded over them as in training (ZeRO-3)
# and the sequences shared out: the loss is the one rank's, digit for digit (one thread per
# rank, so that no reduction depends on the rank count), on Hugging Face fixtures and on a
# frugal checkpoint; the greedy continuation is transformers'; the loss by position bucket adds
# up to the loss.
# usage: eval_ranks.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
fixtures=$2/tests/fixtures/hf
export OMP_NUM_THREADS=1
expected() { grep "\"$2\":" "$fixtures/$1/expected.json" | sed -e 's/^[^:]*: *//' -e 's/,$//' | tr -d '[],'; }

for model in gqa_untied mha_tied_sharded rope_yarn rope_dynamic qwen2_gqa mistral_window; do
  dir=$fixtures/$model
  one=$("${mpi[@]}" -np 1 "$frugal" eval --hf-model "$dir" --tokens "$dir/tokens.txt" 2>/dev/null)
  for n in 2 3; do
    many=$("${mpi[@]}" -np $n "$frugal" eval --hf-model "$dir" --tokens "$dir/tokens.txt" 2>/dev/null)
    [ "$many" = "$one" ] || { echo "FAIL: $model on $n ranks: $many, one rank: $one"; exit 1; }
  done
  greedy=$(expected "$model" greedy)
  prompt=$(expected "$model" prompt)
  new=$(( $(wc -w <<< "$greedy") - $(wc -w <<< "$prompt") ))
  out=$("${mpi[@]}" -np 2 "$frugal" generate --hf-model "$dir" --prompt-ids "$prompt" --ids \
        --max-new-tokens "$new" 2>/dev/null)
  [ "$out" = "$greedy" ] || { echo "FAIL: $model greedy on 2 ranks: $out, transformers: $greedy"; exit 1; }
  echo "$model: 1, 2, 3 ranks $one; greedy on 2 ranks equals transformers'"
done

# The loss by position bucket: the tokens add up, and so does the loss (to rounding).
dir=$fixtures/rope_yarn
out=$("$frugal" eval --hf-model "$dir" --tokens "$dir/tokens.txt" --bucket-tokens 16 2>/dev/null)
echo "$out" | tr '{' '\n' | awk -F'[:,]' '
  /"loss"/ && !/"first"/ { total = $2; tokens = $4 }
  /"first"/ { for (i = 1; i < NF; i++) { if ($i ~ /"loss"/) l = $(i + 1); if ($i ~ /"tokens"/) t = $(i + 1) }
              sum += l * t; count += t; buckets++ }
  END { d = sum / count - total; if (d < 0) d = -d
        if (count != tokens || d > 1e-6 * total || buckets != 5) { print "FAIL: buckets", count, tokens, d, buckets; exit 1 }
        print "buckets of 16 positions: " buckets ", tokens and loss add up" }'

# A frugal checkpoint, read row range by row range on each rank; sequences from a token file.
"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
"$frugal" train --data.dir="$work/data" --model.hidden_size=48 --model.intermediate_size=64 \
  --model.num_hidden_layers=2 --model.num_attention_heads=3 --model.num_key_value_heads=1 \
  --model.vocab_size=400 --model.max_position_embeddings=64 --train.seq_len=32 --train.steps=3 \
  --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 \
  --train.out_dir="$work/run" >/dev/null 2>&1
args=(--ckpt "$work/run" --token-file "$work/data/val.tok" --seq-len 64 --max-sequences 5)
one=$("${mpi[@]}" -np 1 "$frugal" eval "${args[@]}" 2>/dev/null)
two=$("${mpi[@]}" -np 2 "$frugal" eval "${args[@]}" 2>/dev/null)
[ "$two" = "$one" ] || { echo "FAIL: checkpoint on 2 ranks: $two, one rank: $one"; exit 1; }
echo "checkpoint, 5 sequences of val.tok: 1 and 2 ranks $one"

expect_fail() {  # expect_fail MESSAGE ARGS...: the command fails naming the problem
  local message=$1; shift
  local rc=0
  "$@" > "$work/err.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && grep -qF -- "$message" "$work/err.log" \
    || { echo "FAIL: expected an error with '$message'"; cat "$work/err.log"; exit 1; }
}
expect_fail "--logits-out runs on one rank" "${mpi[@]}" -np 2 "$frugal" eval "${args[@]}" --logits-out "$work/l.f32"
expect_fail "--device 'tpu' is not one of auto, cpu, cuda" "$frugal_binary" eval "${args[@]}" --device tpu
expect_fail "fewer than one sequence of" "$frugal" eval --ckpt "$work/run" --token-file "$work/data/val.tok" --seq-len 100000000
expect_fail "is a token file of \`frugal prepare\` (binary), not lines of ids: give it as --token-file" \
  "$frugal" eval --ckpt "$work/run" --tokens "$work/data/val.tok"
printf '5 6\n7 x\001\000\377y 8\n' > "$work/garbled.txt"
expect_fail "line 2: 'x\\x01\\x00\\xffy' is not a token id" "$frugal" eval --ckpt "$work/run" --tokens "$work/garbled.txt"
echo "integration eval_ranks: ok"
