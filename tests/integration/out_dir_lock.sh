#!/usr/bin/env bash
# One run at a time in a train.out_dir (the lock of src/train/run_dir_lock.cpp): of two runs
# started on one directory 0.3 s apart, one is refused by name (the directory, the other's
# rank-0 pid and host) with a non-zero exit, and the other's losses equal a lone run's bit for
# bit; a run started while the first is frozen mid-run (resume=true or false) changes no byte of
# the directory; a run killed with SIGKILL leaves a lock the next run takes over, naming it; and
# the lock holds between two "nodes": processes in their own UTS, network and mount namespaces
# (hostnames node-a and node-b, the directory mounted at another path) where this machine lets
# the test make them.
# usage: out_dir_lock.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=40 --model.intermediate_size=72
        --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=0
        --train.micro_batch_size=2 --train.eval_every=20 --ckpt.every=20 --train.steps=400)
fail() { echo "FAIL: $*"; exit 1; }
train=("${mpi[@]}" -np 2 "$frugal" train "${common[@]}")  # $! of `"${train[@]}" &` is mpirun's pid
# The ranks mpirun $1 started (its children, in pid order), once both are there.
ranks_of() {
  local found=()
  for ((i = 0; i < 300; i++)); do
    mapfile -t found < <(pgrep -P "$1" || true)
    [ "${#found[@]}" -eq 2 ] && break
    sleep 0.02
  done
  echo "${found[@]}"
}
# Every file under $1 with its size, time and checksum.
snapshot() { find "$1" -type f -printf '%P %s %T@\n' | sort; find "$1" -type f -exec md5sum {} + | sort; }
refused_by() {  # LOG DIR: the refusal's message, naming DIR and a holder on this host
  grep -q "^frugal: config key 'train.out_dir': '$2' is in use by another run (pid [0-9]* on host $(hostname), started [0-9T:Z-]*; lock file $2/train.lock)" "$1"
}

"${train[@]}" --train.out_dir="$work/lone" > "$work/lone.log" 2>&1 || { cat "$work/lone.log"; fail "the lone run failed"; }

# 1. Two runs on one out_dir, started 0.3 s apart: whichever takes the lock first trains; the
# other is refused by name, naming the winner's rank 0, and the winner is a lone run bit for bit.
# (400 steps, a few seconds: the winner is still training when the other takes its turn at the
# lock, a second or so after its start, even on a loaded machine.)
"${train[@]}" --train.out_dir="$work/both" > "$work/a.log" 2>&1 &
a=$!
read -r -a a_ranks <<< "$(ranks_of "$a")"
sleep 0.3
"${train[@]}" --train.out_dir="$work/both" > "$work/b.log" 2>&1 &
b=$!
read -r -a b_ranks <<< "$(ranks_of "$b")"
# Which one was refused is in its log (on an idle machine the winner may end first).
rc_a=0; wait "$a" || rc_a=$?
rc_b=0; wait "$b" || rc_b=$?
if grep -q "is in use by another run" "$work/a.log"; then
  loser_log=$work/a.log winner_log=$work/b.log rc=$rc_a winner_rc=$rc_b winner_ranks=("${b_ranks[@]}")
else
  loser_log=$work/b.log winner_log=$work/a.log rc=$rc_b winner_rc=$rc_a winner_ranks=("${a_ranks[@]}")
fi
[ "$rc" -ne 0 ] || { cat "$loser_log"; fail "the second run on one out_dir exited 0"; }
refused_by "$loser_log" "$work/both" || { cat "$loser_log"; fail "no refusal naming the directory and the holder"; }
holder=$(sed -n "s/^frugal: config key .* is in use by another run (pid \([0-9]*\) on host .*/\1/p" "$loser_log")
[ "$holder" = "${winner_ranks[0]}" ] || fail "the refusal names pid $holder, not the other run's rank 0 (${winner_ranks[*]})"
[ "$winner_rc" -eq 0 ] || { cat "$winner_log"; fail "the run that holds the lock failed ($winner_rc)"; }
cmp <(losses "$work/lone/metrics.jsonl") <(losses "$work/both/metrics.jsonl") \
  || fail "the run beside a refused one differs from a lone run"
[ ! -s "$work/both/train.lock" ] || fail "a run that ended cleanly left its details in train.lock"
echo "two runs 0.3 s apart: the second refused ($(grep -o 'is in use by another run (pid [0-9]* on host [^,]*' "$loser_log")), the first equal to a lone run"

# 2. A run frozen (SIGSTOP) after its first checkpoint: a second run, resuming or not, changes
# no byte of the directory and exits non-zero; the first, let go, ends as a lone run does.
"${train[@]}" --train.out_dir="$work/frozen" > "$work/frozen.log" 2>&1 &
first=$!
read -r -a first_ranks <<< "$(ranks_of "$first")"
for ((i = 0; i < 600; i++)); do
  [ -f "$work/frozen/ckpt/LATEST" ] && break
  sleep 0.02
done
[ -f "$work/frozen/ckpt/LATEST" ] || fail "the first run committed no checkpoint"
kill -STOP "${first_ranks[@]}"
# The stop lands when each thread leaves the kernel (a writer thread may be inside a write):
# wait until every thread of both ranks is stopped.
for ((i = 0; i < 500; i++)); do
  running=$(for r in "${first_ranks[@]}"; do cat /proc/"$r"/task/*/stat; done 2>/dev/null \
    | awk '{ sub(/.*\) /, ""); if ($1 != "T" && $1 != "t") n++ } END { print n + 0 }')
  [ "$running" -eq 0 ] && break
  sleep 0.01
done
[ "$running" -eq 0 ] || fail "the first run's ranks did not stop"
before=$(snapshot "$work/frozen")
for resume in true false; do
  rc=0
  "${train[@]}" --train.out_dir="$work/frozen" --train.resume=$resume > "$work/second.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || { kill -CONT "${first_ranks[@]}"; fail "a second run (resume=$resume) beside a live one exited 0"; }
  refused_by "$work/second.log" "$work/frozen" || { kill -CONT "${first_ranks[@]}"; cat "$work/second.log"; fail "resume=$resume: no refusal by name"; }
  [ "$(snapshot "$work/frozen")" = "$before" ] || { diff <(echo "$before") <(snapshot "$work/frozen"); kill -CONT "${first_ranks[@]}"; fail "a refused run (resume=$resume) changed the directory"; }
done
kill -CONT "${first_ranks[@]}"
wait "$first" || { cat "$work/frozen.log"; fail "the frozen run failed once let go"; }
cmp <(losses "$work/lone/metrics.jsonl") <(losses "$work/frozen/metrics.jsonl") \
  || fail "the frozen run differs from a lone run"
echo "a run frozen mid-run: second runs (resume true and false) refused, the directory unchanged, the first equal to a lone run"

# 3. A run killed with SIGKILL holds nothing: the next run takes the lock, names the dead one's
# details, resumes from its checkpoint and ends as a lone run does.
"${train[@]}" --train.out_dir="$work/killed" > "$work/killed.log" 2>&1 &
doomed=$!
read -r -a doomed_ranks <<< "$(ranks_of "$doomed")"
for ((i = 0; i < 600; i++)); do
  [ "$(cat "$work/killed/ckpt/LATEST" 2>/dev/null)" = step_00000040 ] && break
  sleep 0.02
done
kill -KILL "${doomed_ranks[@]}"
wait "$doomed" || true
grep -q "\"pid\":${doomed_ranks[0]}" "$work/killed/train.lock" || fail "the killed run's details are not in train.lock"
"${train[@]}" --train.out_dir="$work/killed" --train.resume=true > "$work/after.log" 2>&1 \
  || { cat "$work/after.log"; fail "the run after a killed one was refused"; }
grep -q "names a run that ended without releasing it (pid ${doomed_ranks[0]} on host $(hostname)" "$work/after.log" \
  || { cat "$work/after.log"; fail "the stale lock is not named"; }
grep -q "resumed from step" "$work/after.log" || fail "the run after the killed one did not resume"
cmp <(losses "$work/lone/metrics.jsonl") <(losses "$work/killed/metrics.jsonl") \
  || fail "the run killed and resumed differs from a lone run"
echo "a run killed with SIGKILL: its lock taken over by the next run, named, resumed exactly"

# 4. Two "nodes": one rank each (no mpirun: a singleton), each in its own UTS, network and mount
# namespace, with its own hostname; node-b sees the directory at another path (a bind mount).
# Here both share one kernel, which arbitrates the lock; on a cluster the file system's lock
# manager does (doc/usage.md says which ones do).
if ! unshare --uts --net --mount true 2>/dev/null; then
  echo "two nodes: skipped: this machine lets the test make no namespaces (unshare needs CAP_SYS_ADMIN)"
  echo "integration out_dir_lock: ok"
  exit 0
fi
# node NAME OUT_DIR ARGS...: sets `node` to the command of frugal train as host NAME, with the
# run directory's parent at another path, $work/NAME/mnt ($! of `"${node[@]}" &` is frugal's).
node() {
  local name=$1 dir=$2
  shift 2
  node=(unshare --uts --net --mount --propagation private bash -c '
    ip link set lo up && hostname "$1" && mkdir -p "$2/mnt" && mount --bind "$3" "$2/mnt" || exit 99
    shift 3; exec "$@"' node "$name" "$work/$name" "$work/shared"
    "$frugal" train "${common[@]}" --train.out_dir="$work/$name/mnt/$dir" "$@")
}
mkdir -p "$work/shared"
node node-a run --train.steps=400
"${node[@]}" > "$work/node-a.log" 2>&1 &
holder_pid=$!
for ((i = 0; i < 600; i++)); do
  grep -q '"host":"node-a"' "$work/shared/run/train.lock" 2>/dev/null && break
  sleep 0.02
done
grep -q '"host":"node-a"' "$work/shared/run/train.lock" || { cat "$work/node-a.log"; fail "node-a took no lock"; }
rc=0
node node-b run --train.resume=true
"${node[@]}" > "$work/node-b.log" 2>&1 || rc=$?
kill -TERM "$holder_pid"  # node-a stops after its step, with a checkpoint
rc_a=0
wait "$holder_pid" || rc_a=$?
[ "$rc_a" -eq 75 ] || { cat "$work/node-a.log"; fail "node-a's run, stopped by SIGTERM, exited $rc_a"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 99 ] || { cat "$work/node-b.log"; fail "node-b's run exited $rc beside node-a's"; }
grep -q "^frugal: config key 'train.out_dir': '$work/node-b/mnt/run' is in use by another run (pid [0-9]* on host node-a, " "$work/node-b.log" \
  || { cat "$work/node-b.log"; fail "node-b's run was not refused naming node-a"; }
echo "two nodes: node-b refused, naming node-a's run"
echo "integration out_dir_lock: ok"
