# Sourced by the GPU training benches (train_vs_torch, qlora_vs_peft): what running frugal
# under mpirun and reading its metrics take. Needs $ranks and a `fail` function; defines
#   work      a scratch directory, removed at exit
#   cores     this machine's cores; OMP_NUM_THREADS is exported as cores / ranks
#   mpi_env   mpirun -x options: LD_LIBRARY_PATH, OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES and
#             FRUGAL_ATTENTION_SM90 when set, and every NCCL_* variable of the caller
#             (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, and NCCL_NVLS_ENABLE=0, which the multi-GPU
#             machines need kept)
#   nccl_json those NCCL_* variables as JSON members, for the result line
# and the functions below (kernel_profile_* time every kernel with CUPTI, when asked).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
cores=$(nproc)  # before OMP_NUM_THREADS is set: nproc obeys it
export OMP_NUM_THREADS=$((cores / ranks > 0 ? cores / ranks : 1))
mpi_env=(-x LD_LIBRARY_PATH -x OMP_NUM_THREADS)
[ -n "${CUDA_VISIBLE_DEVICES+set}" ] && mpi_env+=(-x CUDA_VISIBLE_DEVICES)
[ -n "${FRUGAL_ATTENTION_SM90+set}" ] && mpi_env+=(-x FRUGAL_ATTENTION_SM90)
nccl_json=""
for v in $(compgen -e | grep '^NCCL_' || true); do
  mpi_env+=(-x "$v")
  value=${!v//\\/\\\\}
  nccl_json+="${nccl_json:+, }\"$v\": \"${value//\"/\\\"}\""
done

# frugal prepare CORPUS into $work/data (a 512-token vocabulary).
prepare_data() {
  "$1" prepare "$2" --out "$work/data" --vocab-size 512 >"$work/prepare.log" 2>&1 \
    || { tail -n 20 "$work/prepare.log" >&2; fail "frugal prepare failed"; }
}

# Tokens/s of the last N steps of a metrics.jsonl (all ranks): their harmonic mean, i.e. the
# tokens over the time.
tokens_per_s() {
  grep '"loss"' "$1" | tail -n "$2" | grep -o '"tokens_per_s":[^,}]*' | cut -d: -f2 \
    | awk '{ s += 1 / $1; n++ } END { printf "%.1f", n / s }'
}

# Rank 0's mean seconds of KEY (forward_backward or optimizer, from the "seconds" member) over
# the last N steps of a metrics.jsonl, null where the binary does not write them.
mean_seconds() {
  { grep '"loss"' "$1" | tail -n "$2" | grep -o "\"$3\":[0-9.e+-]*" || true; } | cut -d: -f2 \
    | awk '{ s += $1; n++ } END { print (n ? sprintf("%.4f", s / n) : "null") }'
}

# The largest value of KEY in a metrics.jsonl, null where the binary does not write it.
max_of() {
  { grep -o "\"$2\":[0-9.e+]*" "$1" || true; } | cut -d: -f2 \
    | awk 'BEGIN { m = "" } { if (m == "" || $1 + 0 > m + 0) m = $1 } END { print (m == "" ? "null" : sprintf("%.0f", m)) }'
}

calc() { awk "BEGIN { printf \"$1\", $2 }"; }
gib() { if [ "$1" = null ]; then echo null; else calc %.2f "$1 / 1073741824"; fi; }

# Kernel timings (tools/bench/kernel_profile.cpp, a CUPTI injection library): after
# `kernel_profile_start DIR` (nothing when DIR is empty), each CUDA program run after
# `kernel_profile_as NAME` writes DIR/NAME.json, frugal's ranks included (mpi_env);
# `kernel_profile_table PYTHON` prints every such run's kernel families side by side on stderr.
# KERNEL_PROFILE_LIB names the library (default build-cuda/libfrugal_kernel_profile.so);
# PROFILE_SKIP_S leaves out each run's first seconds.
kernel_profile_dir=""
kernel_profile_start() {
  [ -n "$1" ] || return 0
  local lib
  lib=$(realpath "${KERNEL_PROFILE_LIB:-build-cuda/libfrugal_kernel_profile.so}")
  [ -f "$lib" ] || fail "no kernel profile library at '$lib' (set KERNEL_PROFILE_LIB)"
  mkdir -p "$1"
  kernel_profile_dir=$(realpath "$1")
  export CUDA_INJECTION64_PATH=$lib FRUGAL_KERNEL_PROFILE_SKIP_S=${PROFILE_SKIP_S:-0}
  mpi_env+=(-x CUDA_INJECTION64_PATH -x FRUGAL_KERNEL_PROFILE -x FRUGAL_KERNEL_PROFILE_SKIP_S)
}
kernel_profile_as() {
  if [ -n "$kernel_profile_dir" ]; then export FRUGAL_KERNEL_PROFILE=$kernel_profile_dir/$1.json; fi
}
kernel_profile_table() {
  [ -n "$kernel_profile_dir" ] || return 0
  # The library's own line from each run (records counted, or why none were).
  grep -h '^kernel_profile:' "$work"/*.log >&2 2>/dev/null || true
  "$1" - "$kernel_profile_dir"/*.json >&2 <<'PY' || true
import json, os, sys
runs = [(os.path.basename(p)[:-5], json.load(open(p))) for p in sys.argv[1:] if os.path.exists(p)]
families = sorted({f for _, r in runs for f in r["families"]},
                  key=lambda f: -max(r["families"].get(f, {"ms": 0})["ms"] for _, r in runs))
print("%-12s" % "family" + "".join("%22s" % name for name, _ in runs))
for f in families:
    print("%-12s" % f + "".join("%13.1f ms %5.1f%%" % (r["families"][f]["ms"], 100 * r["families"][f]["share"])
                                 if f in r["families"] else "%22s" % "-" for _, r in runs))
print("%-12s" % "kernels" + "".join("%13.1f ms %6s" % (r["kernel_ms"], "") for _, r in runs))
print("%-12s" % "window" + "".join("%13.1f ms %6s" % (r["window_ms"], "") for _, r in runs))
for name, r in runs:  # where each run's GPU idled, and after what
    if "idle_ms" in r:
        print("%s: GPU idle %.1f ms of the %.1f ms window; most after: " % (name, r["idle_ms"], r["window_ms"]) + "; ".join(
            "%s %d x, %.1f ms" % (a["name"][:60], a["count"], a["ms"]) for a in r["idle_after"][:6]))
for name, r in runs:  # where each run's host waited or launched: its costliest runtime calls
    print("%s: host time in CUDA runtime calls: " % name + "; ".join(
        "%s %d x, %.1f ms (max %.2f)" % (a["name"], a["count"], a["ms"], a["max_ms"])
        for a in r.get("runtime_api", [])[:8]))
PY
}
