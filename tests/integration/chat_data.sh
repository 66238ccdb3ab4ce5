#!/usr/bin/env bash
# Instruction and chat data end to end, and what bad input gets: prepare with the Qwen2 and
# Mistral chat fixtures (tests/fixtures/chat), the counts in prepare.json, training from scratch
# on the assistant turns (resumed, and over two cp ranks, as a straight one-rank run), eval
# --data against prepare's counts, generate --chat; an unknown
# role, an empty assistant turn, a template that raises, data with nothing to train, a mode
# that does not apply, conversations longer than the window, a tokenizer without a template,
# plain text mixed in, a line that is not UTF-8, --skip-bad-records.
# usage: chat_data.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
root=$2
export OMP_NUM_THREADS=1
cd "$work"
qwen=$root/tests/fixtures/chat/qwen2
mistral=$root/tests/fixtures/chat/mistral
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error PATTERN CMD...: CMD exits non-zero and prints PATTERN (grep -E).
expect_error() {
  local pattern=$1
  shift
  if "$@" > err.log 2>&1; then fail "expected '$*' to fail"; fi
  grep -qE -- "$pattern" err.log || { cat err.log >&2; fail "no '$pattern' from '$*'"; }
}
json_number() { grep -o "\"$2\": [0-9]*" "$1" | head -1 | grep -o '[0-9]*$'; }
# The sum of every "KEY": N in a JSON file (train's and val's counts together).
json_sum() { grep -o "\"$2\": [0-9]*" "$1" | grep -o '[0-9]*$' | awk '{ s += $1 } END { print s + 0 }'; }

msg() { printf '{"role": "%s", "content": "%s"}' "$1" "$2"; }
{
  for i in $(seq 1 30); do
    printf '{"messages": [%s, %s, %s, %s]}\n' "$(msg user "question $i about the river")" \
      "$(msg assistant "answer $i: the river runs to the sea")" "$(msg user "and then $i?")" \
      "$(msg assistant "then it rains, $i times")"
  done
  printf '{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}\n'
} > chats.jsonl
# The ShareGPT line in a file of messages records: refused by name, then read with its own file.
expect_error "chats.jsonl:31: a sharegpt record in a file of messages records" \
  "$frugal" prepare chats.jsonl --tokenizer "$qwen" --out bad
tail -1 chats.jsonl > sharegpt.jsonl && sed -i '$d' chats.jsonl

# Prepare: the counts of replies, train's and val's, in prepare.json.
"$frugal" prepare chats.jsonl sharegpt.jsonl --tokenizer "$qwen" --out data > prepare.log
grep -q '"content": "chat"' data/prepare.json || fail "prepare.json: content"
replies=$(( $(json_sum data/prepare.json reply) + $(json_sum data/prepare.json last_reply) ))
[ "$replies" -gt 0 ] || fail "no reply tokens counted"
for f in tokenizer.json tokenizer_config.json generation_config.json; do
  [ -s "data/$f" ] || fail "prepare did not copy $f"
done

# Training from scratch on the assistant turns, two ranks; then eval --data on the same
# conversations counts exactly the reply tokens prepare counted in both splits (no
# conversation is cut).
model=(--model.hidden_size=32 --model.intermediate_size=64 --model.num_hidden_layers=1
       --model.num_attention_heads=2 --model.num_key_value_heads=1 --model.vocab_size=3008
       --model.max_position_embeddings=256)
"${mpi[@]}" -np 2 "$frugal" train "${model[@]}" --data.dir=data --train.steps=2 --train.seq_len=32 \
  --train.micro_batch_size=2 --train.sample_tokens=0 --train.eval_batches=1 --train.out_dir=run \
  > train.log
grep -q "data: chat data, data.train_on = auto (assistant): " train.log || { cat train.log; fail "no trained share"; }
"$frugal" eval --ckpt run --data chats.jsonl > eval.json
"$frugal" eval --ckpt run --data sharegpt.jsonl > eval_sharegpt.json
tokens=$(( $(grep -o '"tokens":[0-9]*' eval.json | cut -d: -f2) + $(grep -o '"tokens":[0-9]*' eval_sharegpt.json | cut -d: -f2) ))
[ "$tokens" -eq "$replies" ] || fail "eval --data counted $tokens trained tokens, prepare $replies replies"
grep -q '"train_on":"assistant"' eval.json || fail "eval does not say what it counted"
# eval --token-file packs as training does: packed conversations give each one's loss alone,
# the loss of one per sequence (pad) to float rounding, over the same trained tokens.
"$frugal" eval --ckpt run --token-file data/train.tok --seq-len 64 > packed.json
"$frugal" eval --ckpt run --token-file data/train.tok --seq-len 64 --packing pad > pad.json
grep -q '"packing":"documents"' packed.json || fail "eval --token-file does not say it packed: $(cat packed.json)"
[ "$(grep -o '"tokens":[0-9]*' packed.json)" = "$(grep -o '"tokens":[0-9]*' pad.json)" ] || fail "packed and pad eval counted other tokens"
awk -v a="$(grep -o '"loss":[0-9.e+-]*' packed.json | cut -d: -f2)" -v b="$(grep -o '"loss":[0-9.e+-]*' pad.json | cut -d: -f2)" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' || fail "packed eval $(cat packed.json) differs from pad $(cat pad.json)"
"$frugal" eval --ckpt run --token-file data/train.tok --seq-len 64 --packing windows > windows.json
grep -q '"packing"' windows.json && fail "windows eval says it packed"
expect_error "--packing 'tight' is not one of" "$frugal" eval --ckpt run --token-file data/train.tok --seq-len 64 --packing tight
all=$("$frugal" eval --ckpt run --data chats.jsonl --train-on all | grep -o '"tokens":[0-9]*' | cut -d: -f2)
[ "$all" -gt "$tokens" ] || fail "--train-on all counted no more than the replies"

# The masks go with the windows: a run stopped after its step-2 checkpoint and resumed equals a
# straight one bit for bit; each sequence split over two cp ranks trains like one rank (fp32
# reduction order), with the same trained tokens per step.
steps4=(--data.dir=data --train.steps=4 --train.seq_len=32 --train.micro_batch_size=2
        --train.sample_tokens=0 --train.eval_batches=1 --ckpt.every=2 --ckpt.async=false)
"$frugal" train "${model[@]}" "${steps4[@]}" --train.out_dir=straight > /dev/null
FRUGAL_INJECT_FAULT=exit:0:3 "$frugal" train "${model[@]}" "${steps4[@]}" --train.out_dir=resumed   > /dev/null 2>&1 && fail "the injected fault did not stop the run"
"$frugal" train "${model[@]}" "${steps4[@]}" --train.resume=true --train.out_dir=resumed > resumed.log
grep -q "resumed from step 2" resumed.log || fail "did not resume"
cmp <(losses straight/metrics.jsonl) <(losses resumed/metrics.jsonl) || fail "resumed losses differ"
"${mpi[@]}" -np 2 "$frugal" train "${model[@]}" "${steps4[@]}" --parallel.cp=2 --train.out_dir=cp2 > /dev/null
trained() { grep '"loss"' "$1" | grep -o '"trained_tokens":[0-9]*' | cut -d: -f2; }
cmp <(trained straight/metrics.jsonl) <(trained cp2/metrics.jsonl) || fail "cp 2 trained other tokens"
[ "$(max_rel straight/metrics.jsonl cp2/metrics.jsonl | awk '{ print ($1 <= 1e-5) }')" = 1 ] \
  || fail "cp 2 losses differ by $(max_rel straight/metrics.jsonl cp2/metrics.jsonl)"

# generate --chat: the rendered prompt starts with <|im_start|>, the reply stops at an end id.
im_start=$(python3 -c 'import json, sys
print(next(t["id"] for t in json.load(open(sys.argv[1]))["added_tokens"] if t["content"] == "<|im_start|>"))' \
  "$qwen/tokenizer.json")
"$frugal" generate --ckpt run --chat --prompt "hello" --ids --max-new-tokens 4 > gen.txt
[ "$(cut -d' ' -f1 gen.txt)" = "$im_start" ] || fail "generate --chat: the prompt does not start with <|im_start|> ($im_start): $(cat gen.txt)"
printf '[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]\n' > ends.json
expect_error "ends with an assistant turn" "$frugal" generate --ckpt run --chat --messages ends.json

# Bad records: each stops prepare naming file:line; --skip-bad-records counts them instead.
printf '{"messages": [%s, %s]}\n' "$(msg robot "beep")" "$(msg assistant "boop")" > robot.jsonl
expect_error "robot.jsonl:1: message 0: unknown role 'robot'" "$frugal" prepare robot.jsonl --tokenizer "$qwen" --out bad
printf '{"messages": [%s, %s]}\n' "$(msg user "hi")" "$(msg assistant "  ")" > empty.jsonl
expect_error "empty.jsonl:1: message 1 is an empty assistant turn" "$frugal" prepare empty.jsonl --tokenizer "$qwen" --out bad
printf '{"messages": [%s, %s, %s]}\n' "$(msg user "a")" "$(msg user "b")" "$(msg assistant "c")" > twice.jsonl
expect_error "twice.jsonl:1: chat template .* raised an exception: After the optional system message, conversation roles must alternate" \
  "$frugal" prepare twice.jsonl --tokenizer "$mistral" --out bad
# A template that crashes the Jinja engine (unbounded recursion, a division by zero) is tried in
# a child process first and refused by name.
printf '{%% macro f(n) %%}{{ f(n) }}{%% endmacro %%}{{ f(1) }}' > recursive.jinja
expect_error "chat template .*recursive.jinja.* crashed \(signal 11" \
  "$frugal" prepare chats.jsonl --tokenizer "$qwen" --chat-template recursive.jinja --out bad
# What is no regular file where a template or a conversation is read is named, never waited on.
mkfifo pipe
expect_error "--chat-template 'pipe' is a FIFO" timeout 20 "$frugal" prepare chats.jsonl --tokenizer "$qwen" --chat-template pipe --out bad
expect_error "--messages file 'pipe' is a FIFO" timeout 20 "$frugal" generate --ckpt run --chat --messages pipe
printf '{{ 1 / 0 }}' > divide.jinja
expect_error "chat template .* crashed \(signal 8" \
  "$frugal" generate --ckpt run --chat --prompt hi --chat-template divide.jinja
cat chats.jsonl robot.jsonl empty.jsonl > mixed.jsonl
"$frugal" prepare mixed.jsonl --tokenizer "$qwen" --out skipped --skip-bad-records > skipped.log 2>&1
[ "$(json_number skipped/prepare.json skipped_bad_records)" -eq 2 ] || fail "bad records not counted"
grep -q "mixed.jsonl:31: message 0: unknown role 'robot'" skipped.log || fail "the skipped record is not named"
{ cat chats.jsonl; printf '{"messages": [{"role": "user", "content": "caf\xe9"}]}\n'; } > latin1.jsonl
"$frugal" prepare latin1.jsonl --tokenizer "$qwen" --out latin1 > latin1.log 2>&1
[ "$(json_number latin1/prepare.json skipped_invalid_utf8)" -eq 1 ] || fail "the non-UTF-8 line was not skipped and counted"

# Nothing to train: conversations without an assistant turn; a mode that does not apply.
printf '{"messages": [%s]}\n{"messages": [%s]}\n' "$(msg user "a")" "$(msg user "b")" > questions.jsonl
expect_error "has no reply to train on" "$frugal" prepare questions.jsonl --tokenizer "$qwen" --out bad --val-fraction 0
expect_error "data.train_on = completion selects the completions of instruction data, but '.*train.tok' holds chat data" \
  "$frugal" train "${model[@]}" --data.dir=data --data.train_on=completion --train.steps=1 --train.out_dir=bad
printf '{"text": "plain"}\n' > plain.jsonl
expect_error "mixes plain text .* with instruction or chat data" "$frugal" prepare plain.jsonl chats.jsonl --tokenizer "$qwen" --out bad
expect_error "has no chat template" "$frugal" prepare chats.jsonl --tokenizer "$root/tests/fixtures/bpe/qwen2/tokenizer.json" --out bad

# Conversations longer than the window: cut by --max-tokens as --overlong says, each counted; at
# the start of training, the documents longer than a window are counted.
"$frugal" prepare chats.jsonl --tokenizer "$qwen" --out long-truncate --val-fraction 0 --max-tokens 64 > long.log 2>&1
[ "$(json_number long-truncate/prepare.json truncated)" -eq 30 ] || fail "truncated not counted"
grep -q "30 truncated" long.log || fail "truncation not reported"
"$frugal" prepare chats.jsonl --tokenizer "$qwen" --out long-split --val-fraction 0 --max-tokens 64 --overlong split > /dev/null 2>&1
[ "$(json_number long-split/prepare.json split_pieces)" -ge 30 ] || fail "split pieces not counted"
expect_error "no training document is left \(30 longer than --max-tokens dropped" \
  "$frugal" prepare chats.jsonl --tokenizer "$qwen" --out bad --val-fraction 0 --max-tokens 64 --overlong drop
"$frugal" train "${model[@]}" --data.dir=data --train.steps=1 --train.seq_len=24 --train.sample_tokens=0 \
  --train.eval_batches=1 --train.out_dir=short > short.log
# Packed (the default for chat data): the documents longer than a window are split, or with
# data.long_documents = truncate cut, and counted either way; windows counts them as it cuts them.
grep -qE "data: [0-9]+ documents longer than a window \(the longest has [0-9]+ tokens\) are split into pieces of 24 tokens" short.log || { cat short.log; fail "long documents not counted at start"; }
grep -qE "data: data.packing = documents: [0-9]+ documents in [0-9]+ windows of 24 tokens" short.log || fail "packing not reported"
"$frugal" train "${model[@]}" --data.dir=data --train.steps=1 --train.seq_len=24 --train.sample_tokens=0 \
  --train.eval_batches=1 --data.long_documents=truncate --data.train_on=all --train.out_dir=short-truncate > short.log 2>&1
grep -qE "data: [0-9]+ documents longer than a window .* are truncated to 24 tokens .*: [0-9]+ tokens are never trained on" short.log || { cat short.log; fail "truncation at start not counted"; }
"$frugal" train "${model[@]}" --data.dir=data --train.steps=1 --train.seq_len=24 --train.sample_tokens=0 \
  --train.eval_batches=1 --data.packing=windows --train.out_dir=short-windows > short.log
grep -qE "data: [0-9]+ of [0-9]+ documents are longer than a window \(25 tokens" short.log || { cat short.log; fail "long documents not counted at start (windows)"; }
grep -q '"packing"' short-windows/metrics.jsonl && fail "windows runs report packing"
grep -q '"documents_per_window"' short/metrics.jsonl 2>/dev/null || grep -q '"documents_per_window"' short-truncate/metrics.jsonl || fail "metrics.jsonl has no packing"

# Instruction data: completion is the default; last_turn does not apply.
printf '{"prompt": "2 + 2 =", "completion": " 4"}\n{"prompt": "3 + 3 =", "completion": " 6"}\n' > sums.jsonl
"$frugal" prepare sums.jsonl --tokenizer "$qwen" --out sums --val-fraction 0 > /dev/null
expect_error "data.train_on = last_turn selects assistant turns, but '.*train.tok' holds instruction data without conversations" \
  "$frugal" train "${model[@]}" --data.dir=sums --data.train_on=last_turn --train.steps=1 --train.out_dir=bad
echo "integration chat_data: ok"
