#!/usr/bin/env bash
# doc/fine-tuning.md's walkthrough, run as the page shows it (the shell block after its
# "<!-- walkthrough -->" line) on a tiny model: a random Llama with the Qwen2 chat fixture's
# tokenizer and ChatML template (tests/fixtures/chat/qwen2), made and exported by frugal, and
# generated conversations. Then what the run did: the loss on the assistant turns only, the
# counts prepare reported, eval's tokens against them, a chat reply.
# usage: fine_tuning.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
root=$2
export OMP_NUM_THREADS=1
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

# The base model: frugal's own, exported as a Hugging Face directory with the chat tokenizer.
"$frugal" prepare /usr/share/games/fortunes/fortunes --tokenizer "$root/tests/fixtures/chat/qwen2" \
  --out base-data >/dev/null
"$frugal" train --data.dir=base-data --model.hidden_size=64 --model.intermediate_size=128 \
  --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2 \
  --model.vocab_size=3008 --model.max_position_embeddings=512 --model.tie_word_embeddings=false \
  --train.steps=2 --train.seq_len=32 --train.micro_batch_size=2 --train.sample_tokens=0 \
  --train.eval_batches=1 --train.out_dir=base >/dev/null
"$frugal" export --ckpt base --out model >/dev/null
grep -q '"chat_template"' model/tokenizer_config.json || fail "the export lost the chat template"

# Conversations: two or three turns each, some with a system prompt.
make_chats() {
  awk -v n="$1" -v seed="$2" 'BEGIN {
    srand(seed);
    split("the cat sat on a mat near the river while old friends talked about time and code", w, " ");
    for (c = 0; c < n; c++) {
      line = "{\"messages\": [";
      if (c % 3 == 0) line = line "{\"role\": \"system\", \"content\": \"You are terse.\"}, ";
      turns = 2 + c % 2;
      for (t = 0; t < turns; t++) {
        u = ""; a = "";
        for (k = 0; k < 4 + int(rand() * 6); k++) u = u (k ? " " : "") w[1 + int(rand() * 16)];
        for (k = 0; k < 3 + int(rand() * 8); k++) a = a (k ? " " : "") w[1 + int(rand() * 16)];
        line = line (t ? ", " : "") "{\"role\": \"user\", \"content\": \"" u "?\"}, " \
               "{\"role\": \"assistant\", \"content\": \"" a ".\"}";
      }
      print line "]}";
    }
  }'
}
make_chats 80 7 > chats.jsonl
make_chats 6 8 > held_out.jsonl

# The walkthrough, as the page has it.
awk '/^<!-- walkthrough -->$/ { on = 1; next } on && /^```sh$/ { body = 1; next }
     body && /^```$/ { exit } body' "$root/doc/fine-tuning.md" > walkthrough.sh
[ -s walkthrough.sh ] || fail "doc/fine-tuning.md has no walkthrough block"
ln -s "$root/configs" configs
MODEL=$work/model CHATS=chats.jsonl HELD_OUT=held_out.jsonl OUT=$work/out \
SETTINGS="--train.steps=6 --train.seq_len=96 --train.micro_batch_size=2 --train.grad_accum_steps=2 \
--train.warmup_steps=1 --train.eval_every=3 --train.eval_batches=2 --ckpt.every=3 --lora.rank=4" \
  bash -c "set -euo pipefail; frugal() { \"$frugal\" \"\$@\"; }; source walkthrough.sh" > walkthrough.log 2>&1 \
  || { cat walkthrough.log; fail "the walkthrough did not run"; }

# What it did.
grep -q "rendering conversations with chat template" walkthrough.log || fail "prepare used no template"
grep -q "data: chat data, data.train_on = assistant:" walkthrough.log || fail "no trained-target line"
[ -s out/peft/adapter_model.safetensors ] && [ -s out/peft/adapter_config.json ] || fail "no PEFT adapter"
# eval --data: the held-out loss counts the assistant turns' tokens alone.
eval_line=$(grep '"train_on":"assistant"' walkthrough.log) || fail "eval did not report the masked loss"
# Each step trains on the assistant turns' targets alone: fewer than the windows' tokens
# (2 micro-batches of 2 windows of 96 tokens), and more than none.
grep '"loss"' out/metrics.jsonl | grep -o '"trained_tokens":[0-9]*' | cut -d: -f2 \
  | awk '{ n++; if ($1 <= 0 || $1 >= 2 * 2 * 96) bad++ } END { exit !(n > 0 && bad == 0) }' \
  || fail "metrics.jsonl: trained_tokens missing or not below the window tokens"
echo "walkthrough: $eval_line"
echo "integration fine_tuning: ok"
