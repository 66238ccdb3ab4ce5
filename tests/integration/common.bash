# Sourced by the integration scripts (not a test itself: ctest runs *.sh only).
# Sets frugal (the binary, $1) and work (a scratch directory removed at exit), lets Open MPI
# run as root, and defines the helpers the scripts share.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# KEEP=1 keeps the scratch directory for a look after a failure.
if [ -n "${KEEP:-}" ]; then trap - EXIT; echo "work: $work"; fi
# These scripts check fp32 equalities of the CPU backend: on a machine with a GPU, `train`
# would pick it (parallel.device = auto, and eval's and generate's --device auto), so $frugal
# pins the CPU; $frugal_binary is the real one (tests/integration/gpu_*.sh use it).
frugal_binary=$1
frugal=$work/frugal-cpu
cat > "$frugal" <<EOF
#!/usr/bin/env bash
if [ "\${1:-}" = train ]; then shift; exec "$frugal_binary" train "\$@" --parallel.device=cpu; fi
case "\${1:-}" in eval|generate) exec "$frugal_binary" "\$@" --device=cpu ;; esac
exec "$frugal_binary" "\$@"
EOF
chmod +x "$frugal"
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun --oversubscribe --bind-to none)

# The training losses of a metrics.jsonl, one per line.
losses() { grep -o '"loss":[^,}]*' "$1" | cut -d: -f2; }
# The largest relative difference between the losses of two metrics.jsonl files.
max_rel() {
  paste <(losses "$1") <(losses "$2") \
    | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $2; if (r > m) m = r } END { printf "%.3g\n", m }'
}

# First lines of a GPU script (gpu_*.sh): $gpus, the GPUs this machine has; without one the
# script passes, saying so. $corpus: the fortunes text, or its copy beside the repository
# (.scratch/fortunes) on a GPU machine that lacks the package.
require_gpu() {
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${gpus:-0}" -eq 0 ]; then echo "no GPU: skipping"; exit 0; fi
  corpus=/usr/share/games/fortunes/fortunes
  [ -e "$corpus" ] || corpus=$1/.scratch/fortunes/fortunes
}
