#!/usr/bin/env bash
# Asynchronous checkpoints (ckpt.async = true, the default) through the CLI: a run killed after
# its saves and resumed equals a straight run bit for bit (1, 2 and 4 ranks, full and QLoRA);
# an asynchronous checkpoint resumes on another number of ranks (4 -> 2, 2 -> 4) exactly as a
# synchronous one does; a run that schedules no save stages nothing, and its stop signal's save
# resumes exactly; and kill -9 at random moments of the background writes always leaves a
# committed step that verifies and resumes exactly.
# usage: async_ckpt.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=64 --model.intermediate_size=128
        --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=0
        --train.eval_every=6 --train.micro_batch_size=2)

# 1. Killed at step 8 after asynchronous saves at 3 and 6, resumed: the straight run's losses.
# (The save of step 6 waits for step 3's, so step 3 at least is committed when the fault hits.)
for type in full qlora; do
  for np in 1 2 4; do
    run=(--train.type=$type --train.steps=12 --ckpt.every=3)
    "${mpi[@]}" -np $np "$frugal" train "${common[@]}" "${run[@]}" \
      --train.out_dir="$work/straight-$type-$np" > "$work/straight.log" 2>&1 \
      || { echo "FAIL: straight $type np=$np"; tail -20 "$work/straight.log"; exit 1; }
    grep -q "checkpoints: asynchronous" "$work/straight.log" \
      || { echo "FAIL: saves were not asynchronous"; cat "$work/straight.log"; exit 1; }
    rc=0
    FRUGAL_INJECT_FAULT=exit:0:8 "${mpi[@]}" -np $np "$frugal" train "${common[@]}" "${run[@]}" \
      --train.out_dir="$work/killed-$type-$np" > /dev/null 2>&1 || rc=$?
    [ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop $type np=$np"; exit 1; }
    "${mpi[@]}" -np $np "$frugal" train "${common[@]}" "${run[@]}" --train.resume=true \
      --train.out_dir="$work/killed-$type-$np" > "$work/resume.log" 2>&1 \
      || { echo "FAIL: resume $type np=$np"; tail -20 "$work/resume.log"; exit 1; }
    grep -qE "resumed from step (3|6) " "$work/resume.log" \
      || { echo "FAIL: $type np=$np did not resume from step 3 or 6"; cat "$work/resume.log"; exit 1; }
    cmp <(losses "$work/straight-$type-$np/metrics.jsonl") <(losses "$work/killed-$type-$np/metrics.jsonl") \
      || { echo "FAIL: $type np=$np: the resumed losses differ from the straight run's"; exit 1; }
    echo "async resume $type np=$np: $(grep -oE 'resumed from step [0-9]+' "$work/resume.log"), losses identical"
  done
done

# 2. Resharding: a checkpoint of step 6 written asynchronously and one written synchronously
# (same run otherwise) resume on the other number of ranks with identical losses.
for pair in "4 2" "2 4"; do
  set -- $pair
  for mode in true false; do
    "${mpi[@]}" -np "$1" "$frugal" train "${common[@]}" --train.steps=6 --ckpt.async=$mode \
      --train.out_dir="$work/reshard-$1-$mode" > /dev/null 2>&1 || { echo "FAIL: $1 ranks, async=$mode"; exit 1; }
    "${mpi[@]}" -np "$2" "$frugal" train "${common[@]}" --train.steps=12 --ckpt.async=$mode \
      --train.resume=true --train.out_dir="$work/reshard-$1-$mode" > "$work/reshard.log" 2>&1 \
      || { echo "FAIL: resume on $2 ranks"; tail -20 "$work/reshard.log"; exit 1; }
    grep -q "resumed from step 6 " "$work/reshard.log" || { echo "FAIL: no resume on $2 ranks"; exit 1; }
  done
  cmp <(losses "$work/reshard-$1-true/metrics.jsonl") <(losses "$work/reshard-$1-false/metrics.jsonl") \
    || { echo "FAIL: $1 -> $2 ranks: the asynchronous checkpoint resumes differently"; exit 1; }
  echo "async checkpoint of $1 ranks resumed on $2: as the synchronous one"
done

# 3. A run that schedules no save (ckpt.every = 0, ckpt.final = false, as benchmarks run) pins
# no staging memory: its saves are synchronous, and a stop signal's save still resumes exactly.
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.steps=12 --ckpt.final=false \
  --train.out_dir="$work/unscheduled-straight" > "$work/unscheduled.log" 2>&1 \
  || { echo "FAIL: a run without scheduled saves"; tail -20 "$work/unscheduled.log"; exit 1; }
grep -q "checkpoints: synchronous (no save is scheduled" "$work/unscheduled.log" \
  || { echo "FAIL: a run without scheduled saves staged them"; cat "$work/unscheduled.log"; exit 1; }
grep -q '"checkpoint_staging_bytes":0[,}]' "$work/unscheduled-straight/metrics.jsonl" \
  && ! grep -q '"checkpoint_staging_bytes":[1-9]' "$work/unscheduled-straight/metrics.jsonl" \
  || { echo "FAIL: staging memory held without a scheduled save"; exit 1; }
FRUGAL_INJECT_FAULT=signal:0:5 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.steps=12 \
  --ckpt.final=false --train.out_dir="$work/unscheduled" > /dev/null 2>&1 || true
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.steps=12 --ckpt.final=false \
  --train.resume=true --train.out_dir="$work/unscheduled" > "$work/unscheduled.resume" 2>&1 \
  || { echo "FAIL: resume after a stop signal"; tail -20 "$work/unscheduled.resume"; exit 1; }
grep -q "resumed from step 5 " "$work/unscheduled.resume" \
  || { echo "FAIL: the stop signal's save was not resumed"; cat "$work/unscheduled.resume"; exit 1; }
cmp <(losses "$work/unscheduled-straight/metrics.jsonl") <(losses "$work/unscheduled/metrics.jsonl") \
  || { echo "FAIL: the resumed losses differ from the straight run's"; exit 1; }
echo "no scheduled save: nothing staged, a stop signal's save resumed exactly"

# The temporary files `ckpt ls` reports: those of uncommitted steps and the stray ones.
reported_temporary_files() {
  awk '{ if (match($0, /"temporary_files":[0-9]+/)) n += substr($0, RSTART + 18, RLENGTH - 18)
         if (index($0, "\"temporary_file\":")) n++ } END { print n + 0 }' "$1"
}

# A writer killed between a step's commit and LATEST's rename leaves LATEST.tmp beside a
# committed step: ls reports it, resume removes it with a message (a kill below lands there
# about once in a hundred runs, so it is staged here too).
stray=$work/reshard-2-true/ckpt/LATEST.tmp
echo step_00000001 > "$stray"
"$frugal" ckpt ls "$work/reshard-2-true" > "$work/stray.ls" 2>&1
[ "$(reported_temporary_files "$work/stray.ls")" -eq 1 ] && grep -q '"temporary_file":".*LATEST.tmp"' "$work/stray.ls" \
  || { echo "FAIL: ckpt ls does not report a stray LATEST.tmp"; cat "$work/stray.ls"; exit 1; }
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.steps=13 --train.resume=true \
  --train.out_dir="$work/reshard-2-true" > "$work/stray.resume" 2>&1 \
  || { echo "FAIL: resume beside a stray LATEST.tmp"; tail -20 "$work/stray.resume"; exit 1; }
[ ! -e "$stray" ] && grep -q "abandoned" "$work/stray.resume" \
  || { echo "FAIL: a stray LATEST.tmp is not removed with a message on resume"; exit 1; }
echo "a stray LATEST.tmp: reported by ckpt ls, removed with a message on resume"

# 3. kill -9 of a rank at random moments while it writes a checkpoint every step: the last
# committed step always verifies and resumes to the straight run's losses.
big=(--model.hidden_size=128 --model.intermediate_size=256 --model.num_attention_heads=4
     --model.num_hidden_layers=3 --train.steps=40 --ckpt.every=1 --ckpt.keep=2)
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${big[@]}" --train.out_dir="$work/kill-straight" >/dev/null 2>&1
kills=${FRUGAL_ASYNC_KILLS:-20}
for i in $(seq 1 "$kills"); do
  out=$work/kill-$i
  "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${big[@]}" --train.out_dir="$out" > "$out.log" 2>&1 &
  launcher=$!
  # A random moment once training runs: up to 1 s after the first commit (the run takes ~2 s).
  for _ in $(seq 1 200); do [ -e "$out/ckpt/LATEST" ] && break; sleep 0.05; done
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", rand() }')"
  victim=$(pgrep -f -- "--train.out_dir=$out" | while read -r p; do
             [ "$(ps -o comm= -p "$p")" = frugal ] && echo "$p"; done | shuf -n 1 || true)
  [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
  tmp_files=$(find "$out/ckpt" -name '*.tmp' | wc -l)
  "$frugal" ckpt ls "$out" > "$out.ls" 2>&1 || { echo "FAIL: kill $i: ckpt ls"; cat "$out.ls"; exit 1; }
  [ "$(reported_temporary_files "$out.ls")" -eq "$tmp_files" ] \
    || { echo "FAIL: kill $i: ckpt ls does not report the $tmp_files temporary file(s) of the abandoned save"
         find "$out/ckpt" -name '*.tmp'; cat "$out.ls"; exit 1; }
  "$frugal" ckpt verify "$out" > "$out.verify" 2>&1 \
    || { echo "FAIL: kill $i: the committed checkpoints do not verify"; cat "$out.verify"; exit 1; }
  "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" "${big[@]}" --train.resume=true \
    --train.out_dir="$out" > "$out.resume" 2>&1 || { echo "FAIL: kill $i: resume"; tail -20 "$out.resume"; exit 1; }
  cmp <(losses "$work/kill-straight/metrics.jsonl") <(losses "$out/metrics.jsonl") \
    || { echo "FAIL: kill $i: the resumed losses differ"; cat "$out.resume"; exit 1; }
  [ "$tmp_files" -eq 0 ] || grep -q "abandoned" "$out.resume" \
    || { echo "FAIL: kill $i: $tmp_files temporary file(s) of a killed writer not cleaned with a message"; exit 1; }
  [ -z "$(find "$out/ckpt" -name '*.tmp')" ] || { echo "FAIL: kill $i: temporary files left"; exit 1; }
  echo "kill -9 $i: $(grep -oE 'resumed from step [0-9]+' "$out.resume" || echo 'no committed step yet'), ${tmp_files} temporary file(s) cleaned, losses identical"
done
echo "integration async_ckpt: ok"
