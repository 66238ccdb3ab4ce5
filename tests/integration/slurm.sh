#!/usr/bin/env bash
# jobs/train-cpu.sbatch under a real Slurm on this machine: munged, slurmctld and slurmd run
# from a generated slurm.conf in a scratch directory (free high ports, no MpiDefault, as on a
# cluster whose admins set nothing). The job, submitted from a directory outside the
# repository, trains 2 ranks; the test delivers the pre-timeout signal (scancel --signal=USR1
# --batch, what --signal=B:USR1@N sends); the ranks checkpoint, the job requeues itself
# (Restarts=1, the log appended), the second attempt resumes, and the losses equal an
# uninterrupted `mpirun -np 2` run's, bit for bit. The finished job submitted again says it has
# nothing to train. Signals sent to srun itself: SIGUSR1 stops the ranks with a checkpoint
# (exit 75), one SIGINT only prints the tasks' state, SIGTERM kills the step at once. Skipped, saying why, where the daemons cannot run (not root, packages
# missing, a daemon that does not start). Every wait is bounded.
# usage: slurm.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
root=$2
export OMP_NUM_THREADS=1

skip() {
  echo "slurm: skipping: $*"
  exit 0
}
[ "$(id -u)" -eq 0 ] || skip "starting munged, slurmctld and slurmd needs root"
PATH=$PATH:/usr/sbin:/sbin
for tool in munged slurmctld slurmd sbatch scontrol scancel squeue sinfo srun; do
  command -v "$tool" >/dev/null || skip "no $tool (tools/install-deps installs slurm-wlm and munge)"
done
# Every client call has a deadline: with slurmctld gone they retry for minutes.
sbatch() { timeout 60 sbatch "$@"; }
scontrol() { timeout 10 scontrol "$@"; }
scancel() { timeout 60 scancel "$@"; }
squeue() { timeout 10 squeue "$@"; }
sinfo() { timeout 5 sinfo "$@"; }

# --- a one-node cluster in $work/slurm ---------------------------------------------------------
s=$work/slurm
mkdir -p "$s/state" "$s/spool" "$s/tmp" "$s/munge" "$work/tmp" "$work/submit"
chmod 700 "$s/munge"
daemons=()
cleanup() {
  if [ -f "$s/slurm.conf" ] && [ ${#daemons[@]} -gt 1 ]; then  # no job may outlive the test
    scancel --quiet --partition=debug 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' TERM INT  # (so that cleanup runs when ctest or a person stops the test)

# A TCP port nothing listens on, below the kernel's ephemeral range: there, the other tests'
# connections (run beside this one) can take it before slurmctld binds it, which then exits
# with "Address already in use".
free_port() {
  local low=32768 high port
  read -r low high < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  [ "$low" -gt 12000 ] || low=32768
  for ((i = 0; i < 100; i++)); do
    port=$((10000 + RANDOM % (low - 10000)))
    (exec 3<> "/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return 0; }
  done
  return 1
}
node=$(hostname -s)
# The node's CPUs (nproc alone would say OMP_NUM_THREADS), at least the job's 2 tasks.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
[ "$cpus" -ge 2 ] || cpus=2

dd if=/dev/urandom of="$s/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$s/munge/munge.key"
munged --foreground --force --key-file="$s/munge/munge.key" --socket="$s/munge/socket" \
  --pid-file="$s/munge/pid" --log-file="$s/munge/log" --seed-file="$s/munge/seed" \
  > "$s/munged.out" 2>&1 &
daemons+=($!)

export SLURM_CONF=$s/slurm.conf
for ((i = 0; i < 50; i++)); do [ -S "$s/munge/socket" ] && break; sleep 0.1; done
[ -S "$s/munge/socket" ] || skip "munged did not start: $(tail -n 3 "$s/munged.out" "$s/munge/log" 2>&1)"

# slurmctld and slurmd on fresh ports (ctld_pid, slurmd_pid; also in daemons for the cleanup).
start_slurm() {
  ctld_port=$(free_port) && slurmd_port=$(free_port) || skip "found no free TCP port"
  [ "$ctld_port" != "$slurmd_port" ] || skip "found no second free TCP port"
  cat > "$s/slurm.conf" << EOF
ClusterName=frugaltest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it may start again (120 s by default).
AuthInfo=socket=$s/munge/socket,cred_expire=5
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool
TmpFS=$s/tmp
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
ReturnToService=2
SlurmdParameters=config_overrides
FirstJobId=$((1000 + RANDOM % 30000))
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  slurmctld -D -i -f "$s/slurm.conf" > "$s/slurmctld.out" 2>&1 &
  ctld_pid=$!
  slurmd -D -f "$s/slurm.conf" -N "$node" > "$s/slurmd.out" 2>&1 &
  slurmd_pid=$!
  daemons+=("$ctld_pid" "$slurmd_pid")
  start=$SECONDS
}
# Whether the node comes up idle within 30 s while both daemons live (state: its last state).
slurm_up() {
  state=""
  for ((i = 0; i < 300; i++)); do
    kill -0 "$ctld_pid" 2>/dev/null && kill -0 "$slurmd_pid" 2>/dev/null || return 1
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    sleep 0.1
  done
  return 1
}
start_slurm

# --- meanwhile: the data and the uninterrupted run ---------------------------------------------
"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
args=(--data.dir="$work/data" --model.hidden_size=64 --model.intermediate_size=160
      --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=1
      --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=64
      --train.micro_batch_size=4 --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2
      --train.eval_every=100 --train.sample_tokens=4 --train.steps=400 --ckpt.every=100
      --parallel.device=cpu)
"${mpi[@]}" -np 2 "$frugal" train "${args[@]}" --train.out_dir="$work/straight" > "$work/straight.log"

for attempt in 1 2 3; do  # a daemon that exits (a port taken meanwhile) is started again
  slurm_up && break
  why="node state '$state': $(tail -n 3 "$s/slurmctld.out" "$s/slurmd.out" 2>&1 || true)"
  [ "$attempt" -lt 3 ] || skip "the Slurm daemons did not come up ($why)"
  echo "slurm: the daemons did not come up (attempt $attempt; $why); starting them again"
  kill "$ctld_pid" "$slurmd_pid" 2>/dev/null || true
  wait "$ctld_pid" "$slurmd_pid" 2>/dev/null || true
  start_slurm
done
echo "slurm: munged, slurmctld and slurmd up after $((SECONDS - start)) s (ports $ctld_port, $slurmd_port)"

# --- the job -----------------------------------------------------------------------------------
# Submitted from a scratch directory; the job script finds the repository and build/frugal by
# itself (FRUGAL_BIN only when the binary under test lives elsewhere).
[ "$root/build/frugal" -ef "$frugal_binary" ] || export FRUGAL_BIN=$frugal_binary
export TMPDIR=$work/tmp  # Open MPI's session files, apart from other runs on this machine
cd "$work/submit"
job_state() { { scontrol show job -o "$1" 2>/dev/null || true; } | { grep -o 'JobState=[A-Z_]*' || true; } | cut -d= -f2; }
# wait_job JOB STATE SECONDS: until the job is in STATE, or fail (a job that ended otherwise).
wait_job() {
  local st="" deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    st=$(job_state "$1")
    [ "$st" = "$2" ] && return 0
    case $st in FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
      break ;;
    esac
    sleep 0.1
  done
  echo "FAIL: job $1 is '$st' after $3 s, not $2"
  scontrol show job "$1" || true
  cat "$work/submit/frugal-$1.out" 2>/dev/null
  tail -5 "$s/slurmctld.log" "$s/slurmd.log"
  exit 1
}
steps() { if [ -f "$1" ]; then grep -c '"loss"' "$1" || true; else echo 0; fi; }
check_log() {  # LOG PATTERN
  grep -q -- "$2" "$1" || { echo "FAIL: $1 lacks '$2'"; cat "$1"; exit 1; }
}

# signalled_job LAUNCHER OUT: a job of jobs/train-cpu.sbatch (srun or mpirun starting the ranks)
# gets the pre-timeout signal after 10 steps, stops with a checkpoint, requeues itself, resumes
# and finishes with the losses of the uninterrupted run.
signalled_job() {
  local launcher=$1 out=$2 job log stop deadline
  job=$(FRUGAL_LAUNCHER=$launcher sbatch --parsable "$root/jobs/train-cpu.sbatch" "${args[@]}" \
    --train.out_dir="$out") || { echo "FAIL: sbatch failed"; tail -n 5 "$s/slurmctld.log"; exit 1; }
  log=$work/submit/frugal-$job.out
  wait_job "$job" RUNNING 30
  deadline=$((SECONDS + 60))  # for 10 steps
  while [ "$SECONDS" -lt "$deadline" ]; do
    [ "$(steps "$out/metrics.jsonl")" -ge 10 ] && break
    [ "$(job_state "$job")" = RUNNING ] || break
    sleep 0.1
  done
  [ "$(steps "$out/metrics.jsonl")" -ge 10 ] || { echo "FAIL: job $job trained no 10 steps"; cat "$log"; exit 1; }
  scancel --signal=USR1 --batch "$job"
  local signalled=$SECONDS
  wait_job "$job" COMPLETED 90

  # One job, two attempts, one log: signal, clean stop, requeue, resume, the end.
  scontrol show job -o "$job" | grep -q 'Restarts=1 ' \
    || { echo "FAIL: job $job was not requeued once"; scontrol show job "$job" || true; exit 1; }
  scontrol show job -o "$job" | grep -q 'ExitCode=0:0 ' \
    || { echo "FAIL: job $job's exit code"; scontrol show job "$job" || true; exit 1; }
  check_log "$log" "attempt 1 on .*: $launcher "
  check_log "$log" "got SIGUSR1: passing SIGUSR1 to the ranks"
  stop=$(sed -n 's/^stopped by SIGUSR1 at step \([0-9]*\): checkpoint .*/\1/p' "$log")
  [ -n "$stop" ] || { echo "FAIL: no stop message"; cat "$log"; exit 1; }
  [ "$stop" -lt 400 ] || { echo "FAIL: job $job finished before the signal"; exit 1; }
  check_log "$log" "stopped with a checkpoint: requeueing"
  check_log "$log" "attempt 2 on "
  check_log "$log" "resumed from step $stop "
  check_log "$log" "frugal train is done"
  cmp <(losses "$work/straight/metrics.jsonl") <(losses "$out/metrics.jsonl") \
    || { echo "FAIL: job $job's losses differ from the uninterrupted run's"; exit 1; }
  echo "slurm: $launcher: job $job stopped at step $stop, requeued, resumed and finished" \
    "$((SECONDS - signalled)) s after the signal; final loss $(losses "$out/metrics.jsonl" | tail -1)" \
    "as uninterrupted"
}
signalled_job srun "$work/job"
signalled_job mpirun "$work/job-mpirun"  # mpirun inside the allocation works as well

# Signals to srun itself (a job step run by hand, as doc/usage.md's "Stopping" says): srun
# passes SIGUSR1 on to the ranks, which stop with a checkpoint and exit 75, and so does srun;
# one SIGINT (a Ctrl-C) only makes srun print its tasks' state; SIGTERM (or a second Ctrl-C
# within a second) makes srun end the step at once ("forcing job termination": SIGKILL), with
# no checkpoint of its own, the committed ones intact.
srun_step() {  # OUT: a job step of 2 ranks in the background (launcher), once it has 5 steps
  srun --mpi=pmix -n 2 "$frugal" train "${args[@]}" --train.steps=100000 --ckpt.every=5 \
    --train.out_dir="$1" > "$1.log" 2>&1 &
  launcher=$!
  local deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ] && [ "$(steps "$1/metrics.jsonl")" -lt 7 ]; do sleep 0.1; done
  [ "$(steps "$1/metrics.jsonl")" -ge 7 ] || { echo "FAIL: srun trained no 7 steps"; cat "$1.log"; exit 1; }
}
out=$work/srun-usr1
srun_step "$out"
kill -INT "$launcher"
sleep 1.5  # past srun's one second, so the next signal is not a second Ctrl-C
kill -0 "$launcher" 2>/dev/null && ! grep -q "stopping after this step" "$out.log" \
  || { echo "FAIL: one SIGINT to srun reached the ranks or ended srun"; cat "$out.log"; exit 1; }
kill -USR1 "$launcher"
rc=0
wait "$launcher" || rc=$?
stop=$(sed -n 's/^stopped by SIGUSR1 at step \([0-9]*\): checkpoint .*/\1/p' "$out.log")
[ "$rc" -eq 75 ] && [ -n "$stop" ] && [ "$(cat "$out/ckpt/LATEST")" = "$(printf 'step_%08d' "$stop")" ] \
  && "$frugal" ckpt verify "$out" > /dev/null \
  || { echo "FAIL: SIGUSR1 to srun: exit $rc, stop step '$stop'"; cat "$out.log"; exit 1; }
echo "slurm: one SIGINT to srun: its tasks' state; SIGUSR1 to srun: stopped at step $stop with a checkpoint; srun exit 75"
out=$work/srun-term
srun_step "$out"
kill -TERM "$launcher"
rc=0
wait "$launcher" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 75 ] && ! grep -q "^stopped by" "$out.log" && grep -q "forcing job termination" "$out.log" \
  || { echo "FAIL: SIGTERM to srun: exit $rc"; cat "$out.log"; exit 1; }
"$frugal" ckpt verify "$out" > /dev/null || { echo "FAIL: SIGTERM to srun: a committed step does not verify"; exit 1; }
echo "slurm: SIGTERM to srun: the step killed at once (srun exit $rc), the committed checkpoints intact"

# The finished job submitted again: nothing to train, said so, exit 0. Left to itself, the
# script picks srun with Slurm's pmix plugin, which this cluster has but does not default to.
again=$(sbatch --parsable "$root/jobs/train-cpu.sbatch" "${args[@]}" --train.out_dir="$work/job") \
  || { echo "FAIL: sbatch failed"; tail -n 5 "$s/slurmctld.log"; exit 1; }
wait_job "$again" COMPLETED 60
check_log "frugal-$again.out" "attempt 1 on .*: srun --mpi=pmix "
check_log "frugal-$again.out" "the run already reached step 400 = train.steps; nothing to train"
echo "integration slurm: ok ($((SECONDS - start)) s)"
