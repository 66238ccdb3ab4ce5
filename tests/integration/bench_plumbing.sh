#!/usr/bin/env bash
# The GPU benches' shell plumbing, without a GPU: tools/bench/galore_vs_torch and train_vs_torch
# run a stand-in for frugal that writes a metrics.jsonl of known step rates and phases (and,
# when asked, galore.profile records and a kernel profile), and their result lines must carry
# the figures computed here from the same numbers: the tokens/s over the timed steps (their
# harmonic mean), the median step, the mean phase seconds, galore.profile's steady means. A
# bench that fails on some setting would otherwise be found on the GPU machine, where each call
# costs device time (PROFILE=false once failed there, silently, with nothing printed).
# tools/bench/qlora_long_context's bisection runs on a stand-in that runs out of memory above a
# known length, and must report the longest length that fits.
# usage: bench_plumbing.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
cd "$2"

# The stand-in: `prepare` makes the data directory; `train` writes --train.steps records whose
# step s runs at 1000 * (s + 10) tokens/s, with forward_backward 0.1 + s / 1000 s and optimizer
# s / 1000 s; galore_adamw runs add the state line and, with --galore.profile=true, a
# galore_profile record every 3 steps; FRUGAL_KERNEL_PROFILE gets a kernel profile.
fake=$work/fake-frugal
cat > "$fake" <<'EOF'
#!/usr/bin/env bash
cmd=$1; shift
if [ "$cmd" = prepare ]; then
  while [ $# -gt 0 ]; do [ "$1" = --out ] && mkdir -p "$2"; shift; done
  exit 0
fi
[ "$cmd" = train ] || { echo "fake frugal: $cmd?" >&2; exit 2; }
out="" steps=0 opt=adamw profile=false
for a in "$@"; do
  case $a in
    --train.out_dir=*) out=${a#*=} ;; --train.steps=*) steps=${a#*=} ;;
    --optim.type=*) opt=${a#*=} ;; --galore.profile=*) profile=${a#*=} ;;
  esac
done
mkdir -p "$out"
for ((s = 1; s <= steps; s++)); do
  extra=""
  if [ "$opt" = galore_adamw ] && [ "$profile" = true ] && [ $((s % 3)) -eq 0 ]; then
    extra=",\"galore_profile\":{\"steps\":3,\"refreshes\":$((s == 3 ? 30 : 3)),\"refresh_ms\":$s.5,\"projection_ms\":2,\"moments_ms\":1}"
  fi
  printf '{"step":%d,"loss":5.0,"tokens_per_s":%d,"seconds":{"forward_backward":%s,"optimizer":%s},"optimizer_bytes":%d,"device_peak_bytes":999%s}\n' \
    "$s" $((1000 * (s + 10))) "$(awk -v s=$s 'BEGIN { printf "%.3f", 0.1 + s / 1000 }')" \
    "$(awk -v s=$s 'BEGIN { printf "%.3f", s / 1000 }')" $([ "$opt" = adamw ] && echo 800 || echo 300) "$extra" \
    >> "$out/metrics.jsonl"
done
[ "$opt" = galore_adamw ] && echo "optimizer state per rank with GaLore (rank 512, 2 projected matrices): 1.00 MiB"
if [ -n "${FRUGAL_KERNEL_PROFILE:-}" ]; then
  echo '{"window_ms": 10, "kernel_ms": 8, "families": {"gemm": {"count": 1, "ms": 8, "share": 1.0}}, "kernels": [], "idle_ms": 2, "idle_after": [{"name": "after_me", "count": 3, "ms": 2, "max_ms": 1}], "idle_before": [], "runtime_api": []}' \
    > "$FRUGAL_KERNEL_PROFILE"
fi
exit 0
EOF
chmod +x "$fake"
touch "$work/libprofile.so"  # KERNEL_PROFILE_LIB must name a file; the stand-in ignores it

# What the benches must report for the last N of the stand-in's steps (WARMUP before them).
expected() {  # N WARMUP: tokens/s (harmonic mean), median step s, mean fb s, mean optimizer s
  awk -v n="$1" -v w="$2" 'BEGIN {
    for (s = w + 1; s <= w + n; s++) { r = 1000 * (s + 10); inv += 1 / r; t[s - w] = 8192 / r
      fb += 0.1 + s / 1000; opt += s / 1000 }
    printf "%.1f %.6f %.4f %.4f\n", n / inv, t[int((n + 1) / 2)], fb / n, opt / n }'
}
field() { grep -o "\"$2\": [^,}]*" <<<"$1" | head -1 | cut -d' ' -f2; }
same() {  # WHAT GOT WANT: equal as numbers to the printed precision
  awk -v g="$2" -v w="$3" 'BEGIN { d = g - w; exit !(d < 1e-6 && d > -1e-6) }' \
    || { echo "FAIL: $1 is $2, expected $3"; exit 1; }
}

# galore_vs_torch: frugal's two runs only (PEER=0), every timed step counted.
read -r tps median fb opt < <(expected 5 1)
for profile in false true; do
  line=$(FRUGAL=$fake PEER=0 STEPS=5 WARMUP=1 PROFILE=$profile tools/bench/galore_vs_torch 2>"$work/gvt.err" | tail -1) \
    || { echo "FAIL: galore_vs_torch PROFILE=$profile"; cat "$work/gvt.err"; exit 1; }
  adamw=$(grep -o '"frugal_adamw": {[^}]*}' <<<"$line")
  same "galore_vs_torch tokens/s" "$(field "$adamw" tokens_per_s)" "$tps"
  same "galore_vs_torch median step" "$(field "$adamw" median_step_s)" "$median"
  same "galore_vs_torch forward_backward" "$(field "$adamw" forward_backward)" "$fb"
  same "galore_vs_torch optimizer seconds" "$(field "$adamw" optimizer)" "$opt"
  same "GaLore over AdamW" "$(field "$line" frugal_galore_over_adamw_tokens_per_s)" 1
  grep -q '"state_line": "optimizer state per rank with GaLore' <<<"$line" \
    || { echo "FAIL: no GaLore state line"; exit 1; }
  if [ "$profile" = false ]; then
    grep -q '"galore_profile": null' <<<"$line" || { echo "FAIL: a profile without PROFILE"; exit 1; }
  else
    # Records at steps 3 and 6 (3 steps each): steady is the second alone.
    steady=$(grep -o '"steady": {[^}]*}' <<<"$line")
    same "steady refresh_ms" "$(field "$steady" refresh_ms)" 6.5
    same "steady refreshes a step" "$(field "$steady" refreshes_per_step)" 1
    all=$(grep -o '"all": {[^}]*}' <<<"$line")
    same "all refresh_ms" "$(field "$all" refresh_ms)" 5
  fi
done
echo "galore_vs_torch: tokens/s $tps, median $median s, phases $fb / $opt s, profile off and on"

# The kernel profile tables need python3 (as on the GPU machine); plumbing only.
if command -v python3 >/dev/null; then
  FRUGAL=$fake PEER=0 STEPS=5 WARMUP=1 KERNEL_PROFILE=$work/kp KERNEL_PROFILE_LIB=$work/libprofile.so \
    tools/bench/galore_vs_torch python3 > /dev/null 2> "$work/kp.err" \
    || { echo "FAIL: galore_vs_torch KERNEL_PROFILE"; cat "$work/kp.err"; exit 1; }
  [ -s "$work/kp/adamw.json" ] && [ -s "$work/kp/galore.json" ] \
    && grep -q "GPU idle 2.0 ms of the 10.0 ms window; most after: after_me" "$work/kp.err" \
    || { echo "FAIL: no kernel profile table"; cat "$work/kp.err"; exit 1; }
  echo "galore_vs_torch KERNEL_PROFILE: both runs' profiles and the idle line"
fi

# train_vs_torch: frugal alone (PEER=0), 5 timed steps after 1.
line=$(FRUGAL=$fake PEER=0 STEPS=5 WARMUP=1 tools/bench/train_vs_torch 2>"$work/tvt.err" | tail -1) \
  || { echo "FAIL: train_vs_torch"; cat "$work/tvt.err"; exit 1; }
same "train_vs_torch tokens/s" "$(field "$line" frugal_tokens_per_s)" "$tps"
same "train_vs_torch forward_backward" "$(field "$line" forward_backward)" "$fb"
echo "train_vs_torch: tokens/s $tps, forward+backward $fb s"

# qlora_long_context: a stand-in that runs out of memory above 41000 tokens (the stand-in above
# below it); the bisection over multiples of 4096 in [16384, 131072] must find the largest
# multiple within the limit, and report its try's tokens/s (the second step's: 12000).
oom=$work/oom-frugal
cat > "$oom" <<OOM
#!/usr/bin/env bash
for a in "\$@"; do case \$a in --train.seq_len=*) s=\${a#*=} ;; esac; done
[ "\$s" -le 41000 ] || { echo "error: out of memory in cuda:0: allocating 2.00 GiB" >&2; exit 1; }
exec "$fake" "\$@"
OOM
chmod +x "$oom"
line=$(FRUGAL=$oom WHO=frugal LOW=16384 HIGH=131072 STEP=4096 tools/bench/qlora_long_context python3 \
  2>"$work/qlc.err" | tail -1) || { echo "FAIL: qlora_long_context"; cat "$work/qlc.err"; exit 1; }
same "qlora_long_context longest" "$(field "$line" longest_seq)" $((41000 / 4096 * 4096))
same "qlora_long_context tokens/s" "$(field "$line" tokens_per_s)" 12000
echo "qlora_long_context: longest $((41000 / 4096 * 4096)) tokens"
echo "integration bench_plumbing: ok"
