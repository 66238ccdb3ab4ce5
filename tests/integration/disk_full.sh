#!/usr/bin/env bash
# A full disk at 20 random points of a resume and its saves (issue 51): a run killed after step
# 43 (checkpoint 40 committed) resumes to step 60 on a file system with R bytes left, R drawn
# at random (seeded; 5 points within the resume's own first writes, 15 over its saves). Each
# time the run finishes or stops with a "frugal: ..." message (exit 1: no crash, no hang);
# metrics.jsonl is whole JSON records, steps 0 to at least the committed step once each, in
# order; every committed step verifies (`frugal ckpt verify`); and with the room back, the run
# resumes and ends with the losses of an uninterrupted run, bit for bit.
# The small file system is a tmpfs of its own in a private mount namespace (as root, or in a
# user namespace). Where neither can be made (a container without CAP_SYS_ADMIN), the writes
# fail instead past a file size limit (ulimit -f: EFBIG at any byte of any file, one rank).
# usage: disk_full.sh FRUGAL_BINARY REPO_ROOT   (FRUGAL_DISK_FULL_SEED=N draws other points)
if [ -z "${FRUGAL_DISK_FULL_MODE:-}" ]; then
  can_mount='d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs "$d" && umount "$d"; r=$?; rmdir "$d"; exit $r'
  for ns in "unshare --mount --propagation private" \
            "unshare --user --map-root-user --mount --propagation private"; do
    if $ns sh -c "$can_mount" 2>/dev/null; then
      FRUGAL_DISK_FULL_MODE=tmpfs exec $ns bash "$0" "$@"
    fi
  done
  export FRUGAL_DISK_FULL_MODE=fsize
fi
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1
# Open MPI's session files of our own: in a user namespace this process is "root", and another
# process's /tmp/ompi.HOST.0 is not ours to write.
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp
seed=${FRUGAL_DISK_FULL_SEED:-51}
RANDOM=$seed
fail() { echo "FAIL: $*"; exit 1; }

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=40 --model.intermediate_size=72
        --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=0
        --train.micro_batch_size=2 --train.eval_every=10 --ckpt.every=5 --ckpt.keep=10
        --train.steps=60)  # keep 10: no pruning, so each save needs room of its own
if [ "$FRUGAL_DISK_FULL_MODE" = tmpfs ]; then
  train=("${mpi[@]}" -np 2 "$frugal" train "${common[@]}")
else
  # One process (ulimit -f and SIGXFSZ reach it as set), and Open MPI without the shared-memory
  # files that it sizes past the limit (PMIx's dstore, the vader transport): frugal's writes meet it.
  export PMIX_MCA_gds=hash OMPI_MCA_btl=self
  train=("$frugal" train "${common[@]}")
fi

"${train[@]}" --train.out_dir="$work/straight" > "$work/straight.log" 2>&1 \
  || { cat "$work/straight.log"; fail "the uninterrupted run failed"; }
# The run every point resumes: killed as step 44 begins, with checkpoints 35 and 40 committed
# (synchronous saves: committed before the kill, whatever the timing) and metrics.jsonl
# holding steps 41 to 43 past them, which the resume drops.
rc=0
FRUGAL_INJECT_FAULT=exit:0:44 "${train[@]}" --ckpt.async=false --ckpt.keep=2 \
  --train.out_dir="$work/template" > "$work/template.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$(cat "$work/template/ckpt/LATEST")" = step_00000040 ] \
  || { cat "$work/template.log"; fail "the run to resume did not stop at step 44 with step 40 committed"; }
step_bytes=$(du -sb "$work/template/ckpt/step_00000040" | cut -f1)
metrics_bytes=$(stat -c %s "$work/template/metrics.jsonl")

# Whether every line of $1 is one whole JSON object (strings and escapes respected, braces and
# brackets balanced, nothing after the last one closes), and the file ends with a newline.
whole_json_lines() {
  [ ! -s "$1" ] || [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" = '\n' ] || return 1
  awk '{
    depth = 0; in_string = 0; escaped = 0; n = length($0)
    if (substr($0, 1, 1) != "{") exit 1
    for (i = 1; i <= n; i++) {
      c = substr($0, i, 1)
      if (in_string) { if (escaped) escaped = 0; else if (c == "\\") escaped = 1; else if (c == "\"") in_string = 0; continue }
      if (c == "\"") in_string = 1
      else if (c == "{" || c == "[") depth++
      else if (c == "}" || c == "]") { depth--; if (depth < 0) exit 1; if (depth == 0 && i != n) exit 1 }
    }
    if (depth != 0 || in_string) exit 1
  }' "$1"
}
# metrics.jsonl of $1 holds records 0, 1, 2, ..., N (N >= $2), each once, in order.
complete_to() {
  local expect=0 step
  while read -r step; do
    [ "$step" -eq "$expect" ] || return 1
    expect=$((expect + 1))
  done < <(sed -n 's/.*"step":\([0-9]*\)[,}].*/\1/p' "$1/metrics.jsonl")
  [ "$expect" -gt "$2" ]
}

if [ "$FRUGAL_DISK_FULL_MODE" = tmpfs ]; then
  fs=$work/fs
  mkdir -p "$fs"
  mount -t tmpfs -o size=32m tmpfs "$fs" || fail "cannot mount the tmpfs"
  trap 'umount "$fs" 2>/dev/null; rm -rf "$work"' EXIT
  echo "disk full: a 32 MiB tmpfs in a private mount namespace, 2 ranks; seed $seed"
else
  fs=$work/fs
  mkdir -p "$fs"
  echo "disk full: no mount namespace here: a file size limit instead (ulimit -f), 1 rank; seed $seed"
fi
failures=0
for ((point = 1; point <= 20; point++)); do
  # 5 points within the resume's own first writes (lock, configuration, tokenizer, metrics;
  # an older frugal rewrote metrics.jsonl there, needing room for all of it), 15 over its
  # saves (rank files, index.h5, COMMITTED, LATEST, metrics).
  span=$((point <= 5 ? metrics_bytes + 8192 : 9 * step_bytes / 2))
  # Every other point saves synchronously (its commit inside the save, not at a later step).
  if ((point % 2)); then saves=(--ckpt.async=true); else saves=(--ckpt.async=false); fi
  room=$(((RANDOM * 32768 + RANDOM) % span))
  rm -rf "$fs/run" "$fs/filler"
  cp -a "$work/template" "$fs/run"
  rc=0
  if [ "$FRUGAL_DISK_FULL_MODE" = tmpfs ]; then
    free=$(($(stat -f -c '%a * %S' "$fs")))
    [ "$free" -gt "$room" ] || fail "the tmpfs has only $free bytes free"
    fallocate -l $((free - room)) "$fs/filler" 2>/dev/null || head -c $((free - room)) /dev/zero > "$fs/filler"
    timeout 120 "${train[@]}" "${saves[@]}" --train.resume=true --train.out_dir="$fs/run" > "$work/point.log" 2>&1 || rc=$?
  else
    # `room` bytes past the largest file the resume finds (the rank files), so the limit falls
    # within some file it writes: a metrics line, the tokenizer's copy, a rank file.
    limit=$(( (room % (step_bytes / 2)) / 1024 + 1 ))
    # (Its output goes through a pipe: a log file would meet the limit too.)
    timeout 120 bash -c 'ulimit -f "$1"; trap "" XFSZ; shift; exec "$@"' limit "$limit" \
      "${train[@]}" "${saves[@]}" --train.resume=true --train.out_dir="$fs/run" 2>&1 \
      | cat > "$work/point.log" || rc=$?
  fi
  rm -f "$fs/filler"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || { cat "$work/point.log"; fail "point $point ($room): exit $rc, not 0 or 1"; }
  what="finished"
  if [ "$rc" -eq 1 ]; then
    what=$(grep '^frugal: ' "$work/point.log" | grep -v '^frugal: warning' | head -1 | cut -c1-200 || true)
    [ -n "$what" ] || { cat "$work/point.log"; fail "point $point ($room): exit 1 without a message"; }
    failures=$((failures + 1))
  fi
  # The newest committed step, the one a resume takes (LATEST may lag it by a failed write).
  committed=$("$frugal" ckpt ls "$fs/run" | grep -v '"committed":false' | sed -n 's/^{"step":\([0-9]*\),.*/\1/p' | sort -n | tail -1)
  [ -n "$committed" ] && [ "$committed" -ge 40 ] || { "$frugal" ckpt ls "$fs/run"; fail "point $point: no committed step from 40 on"; }
  whole_json_lines "$fs/run/metrics.jsonl" || { tail -3 "$fs/run/metrics.jsonl"; fail "point $point ($room): metrics.jsonl has a line that is not a whole record ($what)"; }
  complete_to "$fs/run" "$committed" || { cut -c1-40 "$fs/run/metrics.jsonl"; fail "point $point ($room): metrics.jsonl lacks records up to step $committed ($what)"; }
  "$frugal" ckpt verify "$fs/run" > "$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "point $point ($room): a committed step does not verify ($what)"; }
  # What eval, generate and export read from the run directory is whole: the tokenizer, and the
  # configuration (the template's, or the resumed run's, line for line).
  cmp -s "$fs/run/tokenizer.model" "$work/data/tokenizer.model" \
    || fail "point $point ($room): the run directory's tokenizer.model is damaged ($what)"
  [ "$(tail -n 1 "$fs/run/train_config.json")" = "}" ] \
    && [ "$(wc -l < "$fs/run/train_config.json")" -eq "$(wc -l < "$work/template/train_config.json")" ] \
    || fail "point $point ($room): train_config.json is cut ($what)"
  # With the room back, the run goes on to the end as if nothing had happened.
  "${train[@]}" --train.resume=true --train.out_dir="$fs/run" > "$work/again.log" 2>&1 \
    || { cat "$work/again.log"; fail "point $point: the resume with room failed"; }
  complete_to "$fs/run" 60 && whole_json_lines "$fs/run/metrics.jsonl" || fail "point $point: the finished run's metrics.jsonl is not steps 0 to 60 once each"
  cmp <(losses "$work/straight/metrics.jsonl") <(losses "$fs/run/metrics.jsonl") \
    || fail "point $point ($room): the run resumed after the full disk differs from the uninterrupted one"
  where="$room bytes left"
  [ "$FRUGAL_DISK_FULL_MODE" = tmpfs ] || where="files up to $limit KiB"
  echo "point $point: $where, ${saves[0]#--}: committed step $committed; $what"
done
[ "$failures" -ge 10 ] || fail "only $failures of 20 points met a full disk: the points miss the writes"
echo "integration disk_full: ok ($failures of 20 points stopped by the full disk, all resumed exactly)"
