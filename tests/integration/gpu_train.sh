#!/usr/bin/env bash
# Training on the GPU through the CLI: it learns, matches the CPU backend to bf16 tolerance,
# resumes a killed run exactly, offloads without changing the losses, trains with bf16 state
# (optim.state_dtype) in half the parameter memory, trains on 2 GPUs like on 1, and the memory
# cap refuses, up front, with a message saying what does not fit.
# Skips itself (exit 0, with a message) on a machine without a GPU.
# usage: gpu_train.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
require_gpu "$2"
export OMP_NUM_THREADS=2
gpu=("$frugal_binary" train --parallel.device=cuda)

"$frugal_binary" prepare "$corpus" --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=256 --model.intermediate_size=688
        --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2
        --model.vocab_size=403 --model.max_position_embeddings=128 --train.seq_len=100
        --train.micro_batch_size=8 --train.lr=3e-3 --train.warmup_steps=5 --train.eval_batches=4
        --train.sample_tokens=8 --train.steps=40 --train.eval_every=20 --optim.eps=1e-6)
val_losses() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }

"${gpu[@]}" "${common[@]}" --train.out_dir="$work/gpu" > "$work/gpu.log"
grep -q "GPU (bf16 compute" "$work/gpu.log" || { echo "FAIL: not on the GPU"; cat "$work/gpu.log"; exit 1; }
grep -q '"device_peak_bytes"' "$work/gpu/metrics.jsonl" || { echo "FAIL: no device_peak_bytes"; exit 1; }
first=$(val_losses "$work/gpu/metrics.jsonl" | head -n 1)
last=$(val_losses "$work/gpu/metrics.jsonl" | tail -n 1)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }' \
  || { echo "FAIL: GPU validation loss $first -> $last"; exit 1; }
echo "GPU: validation loss $first -> $last"

"$frugal" train "${common[@]}" --train.out_dir="$work/cpu" >/dev/null
cpu_last=$(val_losses "$work/cpu/metrics.jsonl" | tail -n 1)
rel=$(max_rel "$work/gpu/metrics.jsonl" "$work/cpu/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 3e-2) }' || { echo "FAIL: GPU vs CPU losses differ by $rel"; exit 1; }
echo "GPU vs CPU: largest relative loss difference $rel; final validation $last vs $cpu_last"

# Killed after the step-20 checkpoint, resumed: the same losses as the straight run.
rc=0
# Synchronous saves: the checkpoint before the injected exit is committed when it hits (an
# asynchronous one may still be in flight; tests/integration/async_ckpt.sh covers those).
FRUGAL_INJECT_FAULT=exit:0:21 "${gpu[@]}" "${common[@]}" --ckpt.async=false --ckpt.every=20 --train.out_dir="$work/re" \
  >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
"${gpu[@]}" "${common[@]}" --ckpt.every=20 --train.resume=true --train.out_dir="$work/re" > "$work/re.log"
grep -q "resumed from step 20" "$work/re.log" || { echo "FAIL: no resume"; cat "$work/re.log"; exit 1; }
rel=$(max_rel "$work/gpu/metrics.jsonl" "$work/re/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 1e-6) }' || { echo "FAIL: resumed run differs by $rel"; exit 1; }
echo "GPU resume: largest relative loss difference $rel"

for mode in optimizer params; do
  "${gpu[@]}" "${common[@]}" --parallel.offload=$mode --train.out_dir="$work/off-$mode" > "$work/off.log"
  rel=$(max_rel "$work/gpu/metrics.jsonl" "$work/off-$mode/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-6) }' || { echo "FAIL: offload=$mode differs by $rel"; exit 1; }
  echo "offload=$mode: largest relative loss difference $rel"
done

# optim.state_dtype = bf16: learns like the fp32 run, needs less memory, resumes exactly (its
# checkpoints hold the bf16 values widened to fp32, which narrow back unchanged).
"${gpu[@]}" "${common[@]}" --optim.state_dtype=bf16 --ckpt.every=20 --train.out_dir="$work/bf16" > "$work/bf16.log"
grep -q "bf16 master weights and gradients (rounded stochastic), bf16 moments" "$work/bf16.log" \
  || { echo "FAIL: not a bf16 run"; cat "$work/bf16.log"; exit 1; }
rel=$(max_rel "$work/bf16/metrics.jsonl" "$work/gpu/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 5e-2) }' || { echo "FAIL: bf16 state vs fp32 differs by $rel"; exit 1; }
a=$(grep -o '"parameters_bytes":[0-9]*' "$work/gpu/metrics.jsonl" | tail -n 1 | cut -d: -f2)
b=$(grep -o '"parameters_bytes":[0-9]*' "$work/bf16/metrics.jsonl" | tail -n 1 | cut -d: -f2)
[ $((2 * b)) -eq "$a" ] || { echo "FAIL: bf16 parameter shards take $b B, fp32 ones $a B"; exit 1; }
rc=0
# Synchronous saves: the checkpoint before the injected exit is committed when it hits (an
# asynchronous one may still be in flight; tests/integration/async_ckpt.sh covers those).
FRUGAL_INJECT_FAULT=exit:0:21 "${gpu[@]}" "${common[@]}" --ckpt.async=false --optim.state_dtype=bf16 --ckpt.every=20 \
  --train.out_dir="$work/bf16-re" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the bf16 run"; exit 1; }
"${gpu[@]}" "${common[@]}" --optim.state_dtype=bf16 --ckpt.every=20 --train.resume=true \
  --train.out_dir="$work/bf16-re" >/dev/null
rel2=$(max_rel "$work/bf16/metrics.jsonl" "$work/bf16-re/metrics.jsonl")
awk -v r="$rel2" 'BEGIN { exit !(r < 1e-6) }' || { echo "FAIL: resumed bf16 run differs by $rel2"; exit 1; }
echo "optim.state_dtype=bf16: against fp32 state $rel, parameter shards $b B (fp32: $a B), resume $rel2"

rc=0
"${gpu[@]}" "${common[@]}" --parallel.gpu_mem_limit=3MiB --train.out_dir="$work/cap" > "$work/cap.log" 2>&1 \
  || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: a 3 MiB cap did not stop the run"; exit 1; }
# The memory plan refuses it before anything is allocated, with the figures and the cap (the
# arena's own refusal past its cap is tests/gpu/test_device_runtime's).
grep -Eq "state needs at least .* of GPU memory per rank .*capped at 3.00 MiB" "$work/cap.log" \
  || { echo "FAIL: the cap said:"; cat "$work/cap.log"; exit 1; }
echo "cap: $(grep -o 'the run.s state needs.*' "$work/cap.log" | head -n 1)"

if [ "$gpus" -ge 2 ]; then
  "${mpi[@]}" -np 2 -x OMP_NUM_THREADS -x LD_LIBRARY_PATH "${gpu[@]}" "${common[@]}" \
    --train.micro_batch_size=4 --train.out_dir="$work/two" > "$work/two.log"
  rel=$(max_rel "$work/gpu/metrics.jsonl" "$work/two/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-2) }' || { echo "FAIL: 2 GPUs differ by $rel"; exit 1; }
  echo "2 GPUs vs 1: largest relative loss difference $rel"
  "${mpi[@]}" -np 2 -x OMP_NUM_THREADS -x LD_LIBRARY_PATH "${gpu[@]}" "${common[@]}" \
    --train.micro_batch_size=4 --parallel.offload=optimizer --train.out_dir="$work/two-off" > "$work/two-off.log"
  rel=$(max_rel "$work/two/metrics.jsonl" "$work/two-off/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-6) }' || { echo "FAIL: 2 GPUs offloaded differ by $rel"; exit 1; }
  echo "2 GPUs, offload=optimizer: largest relative loss difference $rel"
else
  echo "one GPU: the 2-GPU comparison is skipped"
fi
