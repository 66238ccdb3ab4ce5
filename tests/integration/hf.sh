#!/usr/bin/env bash
# Hugging Face interop end to end, without Python: eval and generate on the transformers
# fixtures (tests/fixtures/hf, made by tools/make_hf_fixtures.py) print transformers' loss and
# greedy tokens; a small trained frugal run exports to a HF directory that frugal reads back
# with the same loss and text; bad model directories and bad input stop with a message that
# names the file and tensor.
# usage: hf.sh FRUGAL_BINARY REPO_ROOT
set -euo pipefail
frugal=$1
root=$2
fixtures=$root/tests/fixtures/hf
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2

# A key's value on its line of expected.json ('"greedy": [1, 2]' -> '1 2').
expected() { grep "\"$2\":" "$fixtures/$1/expected.json" | sed -e 's/^[^:]*: *//' -e 's/,$//' | tr -d '[],'; }
json_field() { grep -o "\"$2\":[^,}]*" <<<"$1" | cut -d: -f2; }

# --- parity with transformers --------------------------------------------------------------
for model in gqa_untied mha_tied_sharded; do
  out=$("$frugal" eval --hf-model "$fixtures/$model" --tokens "$fixtures/$model/tokens.txt")
  loss=$(json_field "$out" loss)
  want=$(expected $model loss)
  awk -v a="$loss" -v b="$want" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d < 1e-5) }' \
    || { echo "FAIL: $model: eval loss $loss, transformers $want"; exit 1; }
  [ "$(json_field "$out" tokens)" = "$(expected $model tokens)" ] \
    || { echo "FAIL: $model: token count in '$out'"; exit 1; }

  prompt=$(expected $model prompt)
  greedy=$(expected $model greedy)
  n_new=$(( $(wc -w <<<"$greedy") - $(wc -w <<<"$prompt") ))
  for cache in "" --no-cache; do
    got=$("$frugal" generate --hf-model "$fixtures/$model" --prompt-ids "$prompt" \
            --max-new-tokens "$n_new" --ids $cache)
    [ "$got" = "$greedy" ] || { echo "FAIL: $model $cache: generate gave '$got', transformers '$greedy'"; exit 1; }
  done
  # Sampling is seeded: the same seed, the same tokens.
  s1=$("$frugal" generate --hf-model "$fixtures/$model" --prompt-ids "$prompt" --max-new-tokens 8 \
         --temperature 0.9 --top-p 0.8 --seed 5 --ids)
  s2=$("$frugal" generate --hf-model "$fixtures/$model" --prompt-ids "$prompt" --max-new-tokens 8 \
         --temperature 0.9 --top-p 0.8 --seed 5 --ids --no-cache)
  [ "$s1" = "$s2" ] || { echo "FAIL: $model: sampled '$s1' with cache, '$s2' without"; exit 1; }
done

# --- export of a trained frugal run ------------------------------------------------------
corpus=/usr/share/games/fortunes/fortunes
[ -f "$corpus" ] || { echo "missing $corpus (tools/install-deps installs fortunes-min)"; exit 1; }
"$frugal" prepare "$corpus" --out "$work/data" --vocab-size 512 >/dev/null
"$frugal" train --data.dir="$work/data" --model.hidden_size=48 --model.intermediate_size=96 \
  --model.num_hidden_layers=2 --model.num_attention_heads=3 --model.num_key_value_heads=1 \
  --model.vocab_size=512 --model.max_position_embeddings=64 --model.tie_word_embeddings=true \
  --train.seq_len=32 --train.micro_batch_size=4 --train.steps=12 --train.lr=5e-3 \
  --train.warmup_steps=2 --train.eval_batches=1 --train.out_dir="$work/run" >/dev/null

"$frugal" export --ckpt "$work/run" --out "$work/hf32" >/dev/null
"$frugal" export --ckpt "$work/run" --out "$work/hf16" --dtype bf16 >/dev/null
for f in config.json generation_config.json model.safetensors tokenizer.model tokenizer_config.json; do
  [ -f "$work/hf32/$f" ] || { echo "FAIL: export wrote no $f"; ls "$work/hf32"; exit 1; }
done
grep -q '"LlamaForCausalLM"' "$work/hf32/config.json" || { echo "FAIL: config.json architecture"; exit 1; }
grep -q '"torch_dtype": "bfloat16"' "$work/hf16/config.json" || { echo "FAIL: bf16 config.json dtype"; exit 1; }
[ "$(stat -c %s "$work/hf16/model.safetensors")" -lt "$(stat -c %s "$work/hf32/model.safetensors")" ] \
  || { echo "FAIL: the bf16 export is not smaller"; exit 1; }

# The f32 export holds the checkpoint's exact weights: the same loss and the same text.
printf 'Fortune favors the bold.\nA penny saved is a penny earned.\n\nQ: Why?\n' > "$work/text.txt"
l_ckpt=$("$frugal" eval --ckpt "$work/run" --text "$work/text.txt")
l_hf=$("$frugal" eval --hf-model "$work/hf32" --text "$work/text.txt")
[ "$l_ckpt" = "$l_hf" ] || { echo "FAIL: eval of the checkpoint '$l_ckpt', of its export '$l_hf'"; exit 1; }
[ "$(json_field "$l_hf" tokens)" -gt 3 ] || { echo "FAIL: eval --text counted '$l_hf'"; exit 1; }
l_16=$("$frugal" eval --hf-model "$work/hf16" --text "$work/text.txt")
awk -v a="$(json_field "$l_16" loss)" -v b="$(json_field "$l_hf" loss)" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.05) }' \
  || { echo "FAIL: bf16 export loss $l_16 far from f32 $l_hf"; exit 1; }
g_ckpt=$("$frugal" generate --ckpt "$work/run" --prompt "The" --max-new-tokens 12)
g_hf=$("$frugal" generate --hf-model "$work/hf32" --prompt "The" --max-new-tokens 12)
g_nc=$("$frugal" generate --hf-model "$work/hf32" --prompt "The" --max-new-tokens 12 --no-cache)
[ "$g_ckpt" = "$g_hf" ] || { echo "FAIL: generate from the checkpoint '$g_ckpt', its export '$g_hf'"; exit 1; }
[ "$g_hf" = "$g_nc" ] || { echo "FAIL: generate with cache '$g_hf', without '$g_nc'"; exit 1; }
[[ "$g_hf" == The* ]] || { echo "FAIL: generate did not print the prompt: '$g_hf'"; exit 1; }

# Import -> export -> import: the same bytes.
"$frugal" export --hf-model "$work/hf32" --out "$work/hf32b" >/dev/null
cmp "$work/hf32/model.safetensors" "$work/hf32b/model.safetensors" \
  || { echo "FAIL: re-export of an export changed model.safetensors"; exit 1; }
"$frugal" export --hf-model "$work/hf16" --out "$work/hf16b" --dtype bf16 >/dev/null
cmp "$work/hf16/model.safetensors" "$work/hf16b/model.safetensors" \
  || { echo "FAIL: bf16 re-export changed model.safetensors"; exit 1; }

# --- bad input: a clear message and a non-zero exit, never a crash ------------------------
expect_error() {
  local pattern=$1
  shift
  local out rc=0
  out=$("$frugal" "$@" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL: 'frugal $*' exited $rc"; echo "$out"; exit 1
  fi
  grep -q -- "$pattern" <<<"$out" || { echo "FAIL: 'frugal $*' said:"; echo "$out"; echo "expected: $pattern"; exit 1; }
}
gqa=$fixtures/gqa_untied
toks=$gqa/tokens.txt

mkdir "$work/noshard" && cp "$fixtures/mha_tied_sharded/"* "$work/noshard/"
rm "$work/noshard/model-00002-of-00002.safetensors"
expect_error "shard '.*model-00002-of-00002.safetensors' (holding tensor 'model.layers.1" \
  eval --hf-model "$work/noshard" --tokens "$toks"

mkdir "$work/shape" && cp "$gqa/"* "$work/shape/"
perl -0777 -pi -e 's/("model\.layers\.1\.self_attn\.k_proj\.weight":\{"dtype":"F32","shape":\[)32,64/${1}64,32/' \
  "$work/shape/model.safetensors"
expect_error "model.safetensors': tensor 'model.layers.1.self_attn.k_proj.weight' has shape \[64, 32\], but config.json implies \[32, 64\]" \
  eval --hf-model "$work/shape" --tokens "$toks"

mkdir "$work/cut" && cp "$gqa/"* "$work/cut/"
head -c 200000 "$gqa/model.safetensors" > "$work/cut/model.safetensors"
expect_error "safetensors file '.*model.safetensors': tensor '.*': data_offsets .* the file is truncated" \
  generate --hf-model "$work/cut" --prompt-ids "1 2" --ids

mkdir "$work/arch" && cp "$gqa/"* "$work/arch/"
sed -i 's/LlamaForCausalLM/Qwen3ForCausalLM/' "$work/arch/config.json"
expect_error "config.json: architecture 'Qwen3ForCausalLM' is not supported" \
  eval --hf-model "$work/arch" --tokens "$toks"
mkdir "$work/bias" && cp "$gqa/"* "$work/bias/"
sed -i 's/"attention_bias": false/"attention_bias": true/' "$work/bias/config.json"
expect_error "attention_bias = true is not supported" eval --hf-model "$work/bias" --tokens "$toks"
mkdir "$work/rope" && cp "$gqa/"* "$work/rope/"
sed -i 's/"rope_type": "default"/"rope_type": "longrope"/' "$work/rope/config.json"
expect_error "rope_scaling of type 'longrope'" eval --hf-model "$work/rope" --tokens "$toks"

# Weights that disagree with config.json or are not finite: refused by name. (The unit tests
# cover more: unused tensors, a tied model's lm_head, fractional sizes.)
mkdir "$work/nan" && cp "$gqa/"* "$work/nan/" && chmod u+w "$work/nan/"*
# Overwrites every value of a tensor of a safetensors file with one float.
set_tensor() {  # FILE TENSOR VALUE
  perl -e 'open my $f, "+<", $ARGV[0] or die; binmode $f; read $f, my $len, 8;
           my $n = unpack "Q<", $len; read $f, my $h, $n;
           $h =~ /"\Q$ARGV[1]\E":\{[^}]*"data_offsets":\[(\d+),(\d+)\]/ or die "no $ARGV[1]";
           seek $f, 8 + $n + $1, 0; print $f pack("f<", $ARGV[2]) x (($2 - $1) / 4);' "$@"
}
set_tensor "$work/nan/model.safetensors" model.layers.0.mlp.up_proj.weight nan
expect_error "tensor 'model.layers.0.mlp.up_proj.weight' holds -*nan at row 0, column 0" \
  eval --hf-model "$work/nan" --tokens "$toks"
sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 1/' "$work/nan/config.json"
expect_error "holds 9 tensors that the model of its config.json does not use (model.layers.1" \
  eval --hf-model "$work/nan" --tokens "$toks"
# Finite weights whose forward pass overflows: the loss is refused, not printed as null.
mkdir "$work/huge" && cp "$gqa/"* "$work/huge/" && chmod u+w "$work/huge/"*
set_tensor "$work/huge/model.safetensors" model.norm.weight 3e38
expect_error "eval: the loss of Hugging Face model '.*huge' on '.*' is -*nan" \
  eval --hf-model "$work/huge" --tokens "$toks"
# generate refuses them too, rather than print ids drawn from NaN logits (and exit 0).
for cache in "" --no-cache; do
  expect_error "the model's logits for the next token hold -*\(nan\|inf\) (token id [0-9]*): its weights overflow" \
    generate --hf-model "$work/huge" --prompt-ids "1 2" --ids $cache
done

printf '1 2 3\n4 500 6\n' > "$work/big.txt"
expect_error "sequence 2: token id 500 is outside the model's vocabulary \[0, 112)" \
  eval --hf-model "$gqa" --tokens "$work/big.txt"
printf '1 2 x3\n' > "$work/word.txt"
expect_error "line 1: 'x3' is not a token id" eval --hf-model "$gqa" --tokens "$work/word.txt"
seq 1 70 | tr '\n' ' ' > "$work/long.txt"
expect_error "more than the model's context" eval --hf-model "$gqa" --tokens "$work/long.txt"
# generate within the context (64 tokens): a longer prompt is refused; a continuation stops
# where the sequence fills it, saying so with the number asked (the largest int64 too).
expect_error "generate: --max-new-tokens: the prompt has 70 tokens, more than the model's context of 64 tokens" \
  generate --hf-model "$gqa" --prompt-ids "$(cat "$work/long.txt")" --ids
for asked in 100 9223372036854775807; do
  for cache in "" --no-cache; do
    got=$("$frugal" generate --hf-model "$gqa" --prompt-ids "1 2 3" --ids --ignore-eos \
            --max-new-tokens $asked $cache 2>"$work/warning.txt")
    [ "$(wc -w <<<"$got")" -eq 64 ] || { echo "FAIL: generate $asked $cache printed $(wc -w <<<"$got") ids, not 64"; exit 1; }
    grep -q "generate: --max-new-tokens $asked with a prompt of 3 tokens passes the model's context of 64 tokens (max_position_embeddings = 64): at most 61 new tokens" "$work/warning.txt" \
      || { echo "FAIL: generate $asked $cache warned:"; cat "$work/warning.txt"; exit 1; }
  done
done
expect_error "exactly one of --hf-model DIR or --ckpt DIR" eval --tokens "$toks"
expect_error "exactly one of --hf-model DIR or --ckpt DIR" eval --hf-model "$gqa" --ckpt "$work/run" --tokens "$toks"
expect_error "exactly one of --tokens FILE, --text FILE, --token-file FILE or --data FILE" eval --hf-model "$gqa"
expect_error "has no tokenizer.model" eval --hf-model "$gqa" --text "$work/text.txt"
expect_error "no config.json" eval --hf-model "$work/data" --tokens "$toks"
expect_error "does not exist" eval --hf-model "$work/nowhere" --tokens "$toks"
expect_error "unrecognised option\|unrecognized option" eval --hf-model "$gqa" --tokens "$toks" --bogus
expect_error "exactly one of --prompt TEXT or --prompt-ids" generate --hf-model "$gqa"
expect_error "prompt token id 999 is outside" generate --hf-model "$gqa" --prompt-ids "1 999" --ids
expect_error "generate: --prompt-ids: '-1' is not a token id" generate --hf-model "$gqa" --prompt-ids "1 -1" --ids
expect_error "top-p 0 is not in (0, 1\]" generate --hf-model "$gqa" --prompt-ids "1" --ids --top-p 0
expect_error "has no tokenizer.model or tokenizer.json, needed for --prompt" generate --hf-model "$gqa" --prompt "hi"
expect_error "dtype 'f16' is not one of: f32, bf16" export --ckpt "$work/run" --out "$work/x" --dtype f16
expect_error "--out DIR is required" export --ckpt "$work/run"
expect_error "holds a sharded model" export --hf-model "$gqa" --out "$work/noshard"
expect_error "no LATEST or step directory found" export --ckpt "$work/data" --out "$work/x"
for cmd in eval generate export; do
  help=$("$frugal" $cmd --help)
  grep -q "usage: frugal $cmd" <<< "$help" || { echo "FAIL: $cmd --help"; exit 1; }
done
echo "integration hf: ok"
