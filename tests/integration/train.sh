#!/usr/bin/env bash
# frugal train end to end on a small corpus: the loss falls, two runs with one seed give
# bit-identical losses, a resumed run continues exactly where a straight run would be, and
# bad configurations stop with a message that names the problem.
# usage: train.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
root=$2
export OMP_NUM_THREADS=2

corpus=/usr/share/games/fortunes/fortunes
[ -f "$corpus" ] || { echo "missing $corpus (tools/install-deps installs fortunes-min)"; exit 1; }
"$frugal" prepare "$corpus" --out "$work/data" --vocab-size 512 >/dev/null

common=(--data.dir="$work/data" --model.hidden_size=48 --model.intermediate_size=96
        --model.num_hidden_layers=2 --model.num_attention_heads=3 --model.num_key_value_heads=1
        --model.vocab_size=512 --model.max_position_embeddings=64 --train.seq_len=32
        --train.micro_batch_size=4 --train.grad_accum_steps=2 --train.lr=5e-3
        --train.warmup_steps=2 --train.eval_batches=4 --train.sample_tokens=8
        --monitor.log_every=5)


"$frugal" train "${common[@]}" --train.steps=20 --train.out_dir="$work/a" > "$work/a.log"
"$frugal" train "${common[@]}" --train.steps=20 --train.out_dir="$work/b" > "$work/b.log"
cmp <(losses "$work/a/metrics.jsonl") <(losses "$work/b/metrics.jsonl") \
  || { echo "FAIL: same seed, different losses"; exit 1; }
[ "$(losses "$work/a/metrics.jsonl" | wc -l)" -eq 20 ] || { echo "FAIL: expected 20 step records"; exit 1; }
grep -q '"val_loss"' "$work/a/metrics.jsonl" || { echo "FAIL: no val_loss record"; exit 1; }
grep -q '^sample: ' "$work/a.log" || { echo "FAIL: no sample printed"; exit 1; }
[ -f "$work/a/ckpt/LATEST" ] || { echo "FAIL: no final checkpoint"; exit 1; }

# The loss falls: the mean of the last 5 steps is below the mean of the first 5.
mean_of() { awk '{ s += $1; n++ } END { printf "%.6f\n", s / n }'; }
losses "$work/a/metrics.jsonl" > "$work/a.losses"  # (no early-exiting reader in a pipe)
first=$(head -5 "$work/a.losses" | mean_of)
last=$(tail -5 "$work/a.losses" | mean_of)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' \
  || { echo "FAIL: loss did not fall ($first -> $last)"; exit 1; }

# Resume: a run killed after its step-10 checkpoint and resumed = one run of 20 steps.
"$frugal" train "${common[@]}" --train.steps=20 --ckpt.every=10 --train.out_dir="$work/c" >/dev/null
rc=0
# Synchronous saves: the checkpoint before the injected exit is committed when it hits (an
# asynchronous one may still be in flight; tests/integration/async_ckpt.sh covers those).
FRUGAL_INJECT_FAULT=exit:0:11 "$frugal" train "${common[@]}" --ckpt.async=false --train.steps=20 --ckpt.every=10 \
  --train.out_dir="$work/d" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected fault did not stop the run"; exit 1; }
"$frugal" train "${common[@]}" --train.steps=20 --ckpt.every=10 --train.resume=true \
  --train.out_dir="$work/d" > "$work/d.log"
grep -q 'resumed from step 10' "$work/d.log" || { echo "FAIL: did not resume"; cat "$work/d.log"; exit 1; }
cmp <(losses "$work/c/metrics.jsonl") <(losses "$work/d/metrics.jsonl") \
  || { echo "FAIL: resumed losses differ from a straight run"; exit 1; }
# Resuming with another seed is allowed, and said key by key.
"$frugal" train "${common[@]}" --train.steps=21 --ckpt.every=10 --train.resume=true --train.seed=7 \
  --train.out_dir="$work/d" > "$work/seed.log" 2>&1
grep -q "differ from the checkpoint's:.* train.seed = '7' (checkpoint: '1234')" "$work/seed.log" \
  || { echo "FAIL: no warning for another seed"; cat "$work/seed.log"; exit 1; }

# A corrupt checkpoint: the resume names the file and falls back to the previous committed
# step, which continues exactly like a straight run; with every step corrupt it stops, and
# nothing is deleted.
corrupt() {
  local file=$1 size offset
  size=$(stat -c %s "$file")
  # 8 bytes every 8 KiB through the middle of the file: some land in tensor data.
  for ((offset = size * 3 / 10; offset < size * 7 / 10; offset += 8192)); do
    printf 'garbage!' | dd of="$file" bs=1 seek=$offset conv=notrunc status=none
  done
}
# A 30-step run that dies after its step-20 checkpoint; then step 20 turns out corrupt. The
# resume falls back to step 10, and metrics.jsonl keeps each step once.
# Synchronous saves: the checkpoint before the injected exit is committed when it hits (an
# asynchronous one may still be in flight; tests/integration/async_ckpt.sh covers those).
FRUGAL_INJECT_FAULT=exit:0:21 "$frugal" train "${common[@]}" --ckpt.async=false --train.steps=30 --ckpt.every=10 \
  --train.out_dir="$work/e" >/dev/null 2>&1 || true
corrupt "$work/e/ckpt/step_00000020/rank_00000.h5"
"$frugal" train "${common[@]}" --train.steps=30 --train.resume=true --ckpt.every=10 \
  --train.out_dir="$work/e" > "$work/fallback.log" 2>&1 \
  || { echo "FAIL: no fallback to step 10"; cat "$work/fallback.log"; exit 1; }
grep -q "step 20 is unusable: .*rank_00000.h5" "$work/fallback.log" \
  || { echo "FAIL: the corrupt file was not named"; cat "$work/fallback.log"; exit 1; }
grep -q "resumed from step 10" "$work/fallback.log" || { echo "FAIL: not resumed from 10"; exit 1; }
"$frugal" train "${common[@]}" --train.steps=30 --ckpt.every=10 --train.out_dir="$work/f" >/dev/null
cmp <(losses "$work/e/metrics.jsonl") <(losses "$work/f/metrics.jsonl") \
  || { echo "FAIL: after the fallback the losses differ from a straight run"; exit 1; }

corrupt "$work/c/ckpt/step_00000010/rank_00000.h5"
corrupt "$work/c/ckpt/step_00000020/rank_00000.h5"
rc=0
"$frugal" train "${common[@]}" --train.steps=30 --train.resume=true --train.out_dir="$work/c" \
  > "$work/corrupt.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || { echo "FAIL: corrupt checkpoints gave exit $rc"; cat "$work/corrupt.log"; exit 1; }
grep -q "no committed checkpoint .* can be read" "$work/corrupt.log" || { echo "FAIL: unclear error"; cat "$work/corrupt.log"; exit 1; }
[ -f "$work/c/ckpt/step_00000020/rank_00000.h5" ] && [ -f "$work/c/ckpt/step_00000010/rank_00000.h5" ] \
  || { echo "FAIL: checkpoint files were lost"; exit 1; }

# frugal ckpt verify reads every byte back: the healed run passes, the damaged one does not.
"$frugal" ckpt verify "$work/e" > "$work/verify-e.log" || { echo "FAIL: verify of a good run"; cat "$work/verify-e.log"; exit 1; }
[ "$(grep -c '"ok":true' "$work/verify-e.log")" -eq 2 ] || { echo "FAIL: verify output"; cat "$work/verify-e.log"; exit 1; }
rc=0
"$frugal" ckpt verify "$work/c" > "$work/verify-c.log" || rc=$?
[ "$rc" -eq 1 ] && grep -q '"ok":false' "$work/verify-c.log" || { echo "FAIL: verify of corrupt checkpoints gave $rc"; cat "$work/verify-c.log"; exit 1; }
"$frugal" ckpt ls "$work/e" > "$work/ls-e.log"
grep -q '"step":30,.*"latest":true' "$work/ls-e.log" || { echo "FAIL: ckpt ls"; cat "$work/ls-e.log"; exit 1; }
rc=0
"$frugal" ckpt ls "$work/nowhere" > "$work/ls.log" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -q "holds no committed checkpoint" "$work/ls.log" || { echo "FAIL: ckpt ls of nothing"; exit 1; }
for bad in "--step -3:--step -3 is negative" "--time-limit nan:--time-limit nan is not a number of seconds"; do
  rc=0
  "$frugal" ckpt verify "$work/e" ${bad%%:*} > "$work/bad.log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] && grep -q -- "${bad#*:}" "$work/bad.log" || { echo "FAIL: ckpt verify ${bad%%:*}"; cat "$work/bad.log"; exit 1; }
done

# LATEST deleted: the committed steps are found from their directories; the resume says
# LATEST is missing and continues exactly from the newest step.
# (Synchronous saves: the step-20 checkpoint is committed when the exit at 21 hits.)
FRUGAL_INJECT_FAULT=exit:0:21 "$frugal" train "${common[@]}" --ckpt.async=false --train.steps=30 \
  --ckpt.every=10 --train.out_dir="$work/h" >/dev/null 2>&1 || true
rm "$work/h/ckpt/LATEST"
"$frugal" train "${common[@]}" --train.steps=30 --ckpt.every=10 --train.resume=true \
  --train.out_dir="$work/h" > "$work/h.log" 2>&1 || { echo "FAIL: resume without LATEST"; cat "$work/h.log"; exit 1; }
grep -q "LATEST' is missing" "$work/h.log" && grep -q "resumed from step 20" "$work/h.log" \
  || { echo "FAIL: resume without LATEST"; cat "$work/h.log"; exit 1; }
cmp <(losses "$work/h/metrics.jsonl") <(losses "$work/f/metrics.jsonl") \
  || { echo "FAIL: after a resume without LATEST the losses differ from a straight run"; exit 1; }
# A run that does not resume, in that directory: the earlier run's steps are moved aside,
# byte for byte, not overwritten or pruned by the new run's.
cp "$work/h/ckpt/step_00000030/rank_00000.h5" "$work/h-step30.h5"
"$frugal" train "${common[@]}" --train.steps=30 --ckpt.every=10 --train.seed=7 \
  --train.out_dir="$work/h" > "$work/h2.log" 2>&1 || { echo "FAIL: fresh run"; cat "$work/h2.log"; exit 1; }
grep -q "held checkpoints of an earlier run: they are moved to '.*earlier_run_1'" "$work/h2.log" \
  || { echo "FAIL: the earlier checkpoints were not set aside"; cat "$work/h2.log"; exit 1; }
cmp "$work/h/ckpt/earlier_run_1/step_00000030/rank_00000.h5" "$work/h-step30.h5" \
  || { echo "FAIL: the earlier run's step 30 was changed"; exit 1; }
[ -f "$work/h/ckpt/earlier_run_1/step_00000020/rank_00000.h5" ] || { echo "FAIL: earlier step 20 lost"; exit 1; }
"$frugal" ckpt verify "$work/h" > "$work/verify-h.log" || { echo "FAIL: verify after a fresh run"; cat "$work/verify-h.log"; exit 1; }

# Bad input: a clear message and a non-zero exit, never a crash.
expect_error() {
  local pattern=$1
  shift
  local out rc=0
  out=$("$frugal" train "$@" 2>&1) || rc=$?
  # non-zero, and not a signal (>= 128 means a crash or an abort)
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then
    echo "FAIL: '$*' exited $rc"; echo "$out"; exit 1
  fi
  grep -q -- "$pattern" <<< "$out" || { echo "FAIL: '$*' said:"; echo "$out"; echo "expected: $pattern"; exit 1; }
}
expect_error "unknown config key 'train.no_such_key'" "${common[@]}" --train.no_such_key=1
expect_error "not divisible by model.num_attention_heads" "${common[@]}" --model.hidden_size=50
expect_error "has no train.tok" "${common[@]}" --data.dir="$work/nowhere"
expect_error "train.lr" "${common[@]}" --train.lr=abc
printf '[train]\nsteps = 3\nbogus = 1\n' > "$work/bad.cfg"
expect_error "unknown config key 'train.bogus'" "$work/bad.cfg" "${common[@]}"
expect_error "config file '$work/missing.cfg' does not exist" "$work/missing.cfg"
expect_error "smaller than the vocabulary" "${common[@]}" --model.vocab_size=100
expect_error "'optim.master_dtype': fp32 with optim.state_dtype = bf16 is not supported" "${common[@]}" \
  --optim.state_dtype=bf16 --optim.master_dtype=fp32
expect_error "'optim.master_dtype': value 'fp16'" "${common[@]}" --optim.master_dtype=fp16
expect_error "'optim.state_dtype': value 'fp8'" "${common[@]}" --optim.state_dtype=fp8
# A directory given as the config file, and a bad value in a config file that the command line
# overrides, are both named (they used to be ignored).
expect_error "config file '$work' is a directory" "$work" "${common[@]}"
printf '[train]\nlr = abc\n' > "$work/bad-lr.cfg"
expect_error "config file '$work/bad-lr.cfg': config key 'train.lr': value 'abc'" "$work/bad-lr.cfg" "${common[@]}" --train.lr=0.1
# A checkpoint directory that cannot be made stops the run before any step, naming it.
mkdir -p "$work/ro" && : > "$work/ro/ckpt"
expect_error "train.out_dir': cannot create the checkpoint directory '$work/ro/ckpt'" "${common[@]}" --train.out_dir="$work/ro" --train.steps=2
# A validation file with ids beyond the model's vocabulary is named (it was found inside the
# embedding, without the file): val.tok from a 1000-token vocabulary beside a 512-token one.
"$frugal" prepare "$corpus" --out "$work/big" --vocab-size 1000 >/dev/null
mkdir -p "$work/mixed" && cp "$work/data/train.tok" "$work/data/tokenizer.model" "$work/mixed/" \
  && cp "$work/big/val.tok" "$work/mixed/"
expect_error "token file '$work/mixed/val.tok' holds the id [0-9]* at token [0-9]*, outside the model's vocabulary \[0, 512)" \
  "${common[@]}" --data.dir="$work/mixed" --train.steps=2
# A model too large for the machine is refused at once with its figures and the key that makes
# it so (it used to grow host memory until the system killed something).
expect_error "model.hidden_size = 65532.* of host memory per rank" \
  "${common[@]}" --model.hidden_size=65532 --train.steps=1
# A billion layers: refused before the parameter table is made (listing them grew host memory
# without bound, 9 GiB a rank after 18 s). Capped at 8 GiB of address space here, so that a
# regression fails instead of filling the machine.
(ulimit -v $((8 << 20)); expect_error "model.num_hidden_layers = 1000000000 blocks" \
  "${common[@]}" --model.num_hidden_layers=1000000000 --train.steps=1) || exit 1
echo "integration train: ok"
