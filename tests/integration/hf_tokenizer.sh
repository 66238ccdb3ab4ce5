#!/usr/bin/env bash
# tokenizer.json end to end: `frugal prepare --tokenizer tokenizer.json` (the Llama-3-style
# fixture of tools/make_bpe_fixtures.py), a short training run on it, then eval --text,
# generate --prompt and export on the run, each picking the run's tokenizer.json; a Qwen2-style
# tokenizer (no bos) prepares token files of documents "ids... eos" and trains; a model directory whose
# tokenizer.json is too big for it is named.   usage: hf_tokenizer.sh FRUGAL_BINARY REPO_ROOT
set -euo pipefail
frugal=$1
root=$2
fixtures=$root/tests/fixtures/bpe
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_error() {  # expect_error PATTERN CMD...: CMD fails and prints PATTERN
  local pattern=$1; shift
  if "$@" >"$work/err.log" 2>&1; then fail "expected '$*' to fail"; fi
  grep -qE -- "$pattern" "$work/err.log" || { cat "$work/err.log" >&2; fail "no '$pattern' from '$*'"; }
}

# The corpus: the printable ASCII lines of the fixture text, four to a document (a fortune
# file: documents between lines holding only '%').
LC_ALL=C grep -a -v -P '[^\x09\x20-\x7E]' "$fixtures/mixed.txt" | grep -v '^%$' | awk 'NR <= 2000' \
  | awk '{ print } NR % 4 == 0 { print "%" }' > "$work/corpus.txt"
"$frugal" prepare "$work/corpus.txt" --out "$work/data" \
  --tokenizer "$fixtures/llama3/tokenizer.json" > "$work/prepare.log"
for f in tokenizer.json tokenizer_config.json train.tok val.tok; do
  [ -s "$work/data/$f" ] || fail "prepare wrote no $f"
done
[ ! -e "$work/data/tokenizer.model" ] || fail "prepare wrote a tokenizer.model"
grep -q "byte-level BPE tokenizer" "$work/prepare.log" || fail "prepare did not say the kind"
for stat in '"vocab_size": 3406' '"bos_id": 3150' '"eos_id": 3151'; do
  grep -qF "$stat" "$work/data/prepare.json" || fail "prepare.json lacks $stat"
done

"$frugal" train --data.dir="$work/data" --model.hidden_size=32 --model.intermediate_size=64 \
  --model.num_hidden_layers=1 --model.num_attention_heads=2 --model.num_key_value_heads=1 \
  --model.vocab_size=3456 --model.max_position_embeddings=128 --train.seq_len=32 \
  --train.micro_batch_size=2 --train.steps=4 --train.lr=5e-3 --train.warmup_steps=1 \
  --train.eval_batches=1 --train.out_dir="$work/run" --parallel.device=cpu > "$work/train.log"
[ -s "$work/run/tokenizer.json" ] || fail "the run directory has no tokenizer.json"

# eval --text and generate use the run's tokenizer.json.
head -20 "$work/corpus.txt" | grep -v -e '^$' -e '^%$' > "$work/eval.txt"
out=$("$frugal" eval --ckpt "$work/run" --text "$work/eval.txt")
grep -q '"loss"' <<<"$out" || fail "eval --text printed '$out'"
text=$("$frugal" generate --ckpt "$work/run" --prompt "The quick" --max-new-tokens 5)
[ -n "$text" ] || fail "generate printed nothing"
ids=$("$frugal" generate --ckpt "$work/run" --prompt "The quick" --max-new-tokens 0 --ids)
[ "${ids%% *}" = 3150 ] || fail "the prompt does not start with <|begin_of_text|> (3150): '$ids'"

# export copies tokenizer.json with its tokenizer_config.json (no LlamaTokenizer one).
"$frugal" export --ckpt "$work/run" --out "$work/hf" > /dev/null
cmp -s "$work/hf/tokenizer.json" "$fixtures/llama3/tokenizer.json" || fail "export: tokenizer.json"
cmp -s "$work/hf/tokenizer_config.json" "$fixtures/llama3/tokenizer_config.json" \
  || fail "export: tokenizer_config.json is not the one beside tokenizer.json"
[ ! -e "$work/hf/tokenizer.model" ] || fail "export wrote a tokenizer.model"
out2=$("$frugal" eval --hf-model "$work/hf" --text "$work/eval.txt")
[ "$out" = "$out2" ] || fail "eval of the export '$out2' differs from the run's '$out'"

# A tokenizer without bos (Qwen2's): documents stored as ids... eos, and a run trains on them.
"$frugal" prepare "$work/corpus.txt" --out "$work/qwen" \
  --tokenizer "$fixtures/qwen2/tokenizer.json" > "$work/prepare_qwen.log"
grep -q "has no bos" "$work/prepare_qwen.log" || fail "prepare did not say the tokenizer has no bos"
for stat in '"bos_id": -1' '"document_layout": "ids... eos"'; do
  grep -qF "$stat" "$work/qwen/prepare.json" || fail "prepare.json of the Qwen2-style run lacks $stat"
done
"$frugal" train --data.dir="$work/qwen" --model.hidden_size=32 --model.intermediate_size=64 \
  --model.num_hidden_layers=1 --model.num_attention_heads=2 --model.num_key_value_heads=1 \
  --model.vocab_size=3072 --model.max_position_embeddings=128 --train.seq_len=32 \
  --train.micro_batch_size=2 --train.steps=2 --train.lr=5e-3 --train.warmup_steps=1 \
  --train.eval_batches=1 --train.sample_tokens=4 --train.out_dir="$work/qwen_run" \
  --parallel.device=cpu > "$work/train_qwen.log" 2>&1 || { cat "$work/train_qwen.log"; fail "training on the Qwen2-style token files"; }
grep -q "sample:" "$work/train_qwen.log" || fail "no sample after training on the Qwen2-style token files"

# Refusals that name the problem.
mkdir "$work/small"
cp "$root/tests/fixtures/hf/gqa_untied/"{config.json,model.safetensors} "$work/small/"
cp "$fixtures/llama3/tokenizer.json" "$work/small/"
expect_error "tokenizer.json' has 3406 pieces, more than the model's vocab_size 112" \
  "$frugal" eval --hf-model "$work/small" --text "$work/eval.txt"
sed 's/"type":"BPE"/"type":"WordPiece"/' "$fixtures/llama3/tokenizer.json" > "$work/small/tokenizer.json"
expect_error "model type 'WordPiece' is not supported" \
  "$frugal" generate --hf-model "$work/small" --prompt hi
echo "hf_tokenizer.sh: OK"
