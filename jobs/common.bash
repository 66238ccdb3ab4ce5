# Sourced by the jobs/*.sbatch templates: what every frugal job does the same way. One call,
#   frugal_train [CONFIG.cfg ...] [--section.key=value ...]
# finds build/frugal, sets the CPU threads per rank from the allocation, launches
# `frugal train ... --train.resume=true` on every task of the job (srun with Slurm's PMIx
# plugin, or mpirun inside the allocation), passes SIGUSR1 and SIGTERM on to the ranks, and
# requeues the job after a clean stop (frugal's exit status 75), so the next attempt resumes
# from the checkpoint. Its exit status is the job's.
#
# Variables it reads (all optional):
#   FRUGAL_HOME      the frugal repository (default: the one this file is in)
#   FRUGAL_BIN       the frugal executable (default: $FRUGAL_HOME/build/frugal)
#   FRUGAL_LAUNCHER  srun | mpirun (default: srun when `srun --mpi=list` offers pmix, else mpirun)
#   FRUGAL_SRUN_MPI  srun's --mpi plugin (default: pmix)

frugal_log() { echo "frugal job${SLURM_JOB_ID:+ $SLURM_JOB_ID}: $*"; }
frugal_fail() {
  echo "frugal job${SLURM_JOB_ID:+ $SLURM_JOB_ID}: $*" >&2
  exit 2
}

# FRUGAL_HOME and FRUGAL_BIN, or a message naming every place looked at.
frugal_find_binary() {
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ -n "${FRUGAL_BIN:-}" ]; then
    [ -x "$FRUGAL_BIN" ] || frugal_fail "FRUGAL_BIN=$FRUGAL_BIN is not an executable file"
    FRUGAL_HOME=${FRUGAL_HOME:-$here}
    return
  fi
  local candidates=() home
  [ -n "${FRUGAL_HOME:-}" ] && candidates+=("$FRUGAL_HOME")
  candidates+=("$here")
  for home in "${candidates[@]}"; do
    if [ -x "$home/build/frugal" ]; then
      FRUGAL_HOME=$(cd "$home" && pwd)
      FRUGAL_BIN=$FRUGAL_HOME/build/frugal
      return
    fi
  done
  local looked
  looked=$(printf '%s/build/frugal, ' "${candidates[@]}")
  frugal_fail "no frugal executable: looked for ${looked%, }. Build it (tools/build, or" \
    "cmake -B build && ninja -C build frugal), or set FRUGAL_HOME to the repository that has" \
    "build/frugal, or FRUGAL_BIN to the executable."
}

# Threads per rank from the allocation: --cpus-per-task when the job has it, else the node's
# CPUs over the ranks on it (SLURM_TASKS_PER_NODE reads like "4(x2),2"; the first node's count).
frugal_set_threads() {
  local threads
  if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    threads=$SLURM_CPUS_PER_TASK
  else
    local tasks_here=${SLURM_TASKS_PER_NODE:-1}
    tasks_here=${tasks_here%%[(,]*}
    threads=$((${SLURM_CPUS_ON_NODE:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)} / tasks_here))
  fi
  [ "$threads" -ge 1 ] || threads=1
  export OMP_NUM_THREADS=$threads
}

# frugal_launcher: the command that starts one rank per task of the job.
frugal_pick_launcher() {
  local ranks=${SLURM_NTASKS:-1} choice=${FRUGAL_LAUNCHER:-}
  local mpi=${FRUGAL_SRUN_MPI:-pmix}
  if [ -z "$choice" ]; then
    # Open MPI started by srun needs Slurm's PMIx plugin; without it every rank dies with
    # "OMPI was not built with SLURM's PMI support". mpirun needs no plugin: inside an
    # allocation it starts its daemons through Slurm by itself.
    if srun --mpi=list 2>&1 | grep -qw "$mpi"; then
      choice=srun
    elif command -v mpirun >/dev/null; then
      choice=mpirun
      frugal_log "srun --mpi=list offers no $mpi plugin: launching with mpirun inside the" \
        "allocation (set FRUGAL_SRUN_MPI to another plugin srun offers, e.g. pmix_v4)"
    else
      frugal_fail "srun --mpi=list offers no $mpi plugin and there is no mpirun: ask for" \
        "Slurm's PMIx plugin (Debian/Ubuntu: slurm-wlm-basic-plugins) or put Open MPI's" \
        "mpirun on PATH; FRUGAL_SRUN_MPI names another plugin to try"
    fi
  fi
  case $choice in
    srun)
      # --kill-on-bad-exit=0: every rank exits 75 after a clean stop, and the first one must
      # not take the others down (a rank that fails stops the others through MPI anyway).
      frugal_launcher=(srun --mpi="$mpi" --kill-on-bad-exit=0 --ntasks="$ranks"
                       --cpus-per-task="$OMP_NUM_THREADS")
      ;;
    mpirun)
      # Ranks fill the allocation's slots; OpenMP threads are bounded by OMP_NUM_THREADS and
      # the job's CPU set, not bound by Open MPI.
      frugal_launcher=(mpirun -np "$ranks" --bind-to none -x OMP_NUM_THREADS)
      ;;
    *) frugal_fail "FRUGAL_LAUNCHER is '$choice': expected srun or mpirun" ;;
  esac
}

# The ranks run in the background so that this shell can take the signals and pass them on:
# SIGUSR1 from `#SBATCH --signal=B:USR1@SECONDS` before the time limit (or `scancel
# --signal=USR1 --batch`), SIGTERM from scancel or preemption. Both srun and mpirun pass
# SIGUSR1 on to every rank, which then checkpoints and exits 75.
frugal_train() {
  [ $# -ge 1 ] || frugal_fail "usage: sbatch JOB.sbatch [CONFIG.cfg ...] [--section.key=value ...]"
  frugal_find_binary
  frugal_set_threads
  frugal_pick_launcher
  frugal_log "attempt $((${SLURM_RESTART_COUNT:-0} + 1)) on ${SLURM_JOB_NODELIST:-$(hostname)}:" \
    "${frugal_launcher[*]} $FRUGAL_BIN train $* --train.resume=true" \
    "(OMP_NUM_THREADS=$OMP_NUM_THREADS)"

  frugal_signals=0 frugal_terminated=0 frugal_ranks=""
  trap 'frugal_signals=$((frugal_signals + 1)); frugal_pass_on USR1' USR1
  trap 'frugal_signals=$((frugal_signals + 1)); frugal_terminated=1; frugal_pass_on TERM' TERM
  "${frugal_launcher[@]}" "$FRUGAL_BIN" train "$@" --train.resume=true &
  frugal_ranks=$!
  local status seen
  while :; do
    seen=$frugal_signals
    status=0
    wait "$frugal_ranks" || status=$?
    # A trapped signal cuts `wait` short (status > 128) while the ranks go on: wait again.
    [ "$status" -gt 128 ] && [ "$frugal_signals" != "$seen" ] && continue
    break
  done
  trap - USR1 TERM

  case $status in
    0) frugal_log "frugal train is done" ;;
    75)
      if [ "$frugal_terminated" = 1 ]; then
        # scancel, scontrol requeue or preemption: Slurm itself requeues a job it requeues or
        # preempts (PreemptMode=REQUEUE); a cancelled one is over. The checkpoint is on disk.
        frugal_log "stopped by SIGTERM with a checkpoint: a job Slurm requeues resumes from it" \
          "by itself, a cancelled one when submitted again"
      elif [ -n "${SLURM_JOB_ID:-}" ]; then
        frugal_log "stopped with a checkpoint: requeueing, the next attempt resumes from it"
        # Slurm ends this script as it requeues the job: nothing may follow.
        scontrol requeue "$SLURM_JOB_ID" \
          || frugal_log "could not requeue (is the job submitted with --requeue?): submit it" \
            "again to resume"
      fi
      ;;
    *) frugal_log "frugal train exited with status $status" ;;
  esac
  return "$status"
}

# SIGUSR1 to srun or mpirun, whichever signal this shell got: both pass SIGUSR1 on to the
# ranks, while mpirun would kill them one second after passing on a SIGTERM. On a scancel or a
# preemption Slurm signals the ranks itself too; frugal takes one signal or several alike.
frugal_pass_on() {
  frugal_log "got SIG$1: passing SIGUSR1 to the ranks, which stop after this step with a checkpoint"
  kill -USR1 "$frugal_ranks" 2>/dev/null || true
}
