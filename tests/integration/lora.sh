#!/usr/bin/env bash
# LoRA and QLoRA fine-tuning through the CLI (train.type = lora | qlora | hqq_lora): a trained base exported to Hugging
# Face format is frozen and adapters train on top of it. The run starts at the base's loss
# exactly (B = 0), lowers the validation loss, trains the same on 2 ranks as on 1, checkpoints
# only the adapters, resumes exactly, exports a merged model, and bad [lora] keys are named.
# usage: lora.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --train.seq_len=32 --train.warmup_steps=2 --train.eval_batches=4
        --train.sample_tokens=0 --optim.eps=1e-6)
"$frugal" train "${common[@]}" --model.hidden_size=64 --model.intermediate_size=128 \
  --model.num_hidden_layers=2 --model.num_attention_heads=4 --model.num_key_value_heads=2 \
  --model.vocab_size=400 --model.max_position_embeddings=64 --train.steps=40 --train.lr=3e-3 \
  --train.micro_batch_size=4 --train.eval_every=40 --train.out_dir="$work/base" >/dev/null
"$frugal" export --ckpt "$work/base" --out "$work/hf" >/dev/null
base_final=$(grep '"val_loss"' "$work/base/metrics.jsonl" | tail -1 | grep -o '"val_loss":[^,}]*' | cut -d: -f2)

lora=(train "${common[@]}" --model.hf_path="$work/hf" --train.type=lora --lora.rank=8
      --lora.alpha=16 --train.lr=1e-2 --train.steps=30 --train.eval_every=15 --ckpt.every=15)
"$frugal" "${lora[@]}" --train.micro_batch_size=4 --train.out_dir="$work/one" > "$work/one.log"
grep -q "LoRA: rank 8, alpha 16 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" "$work/one.log" \
  || { echo "FAIL: no LoRA line"; cat "$work/one.log"; exit 1; }
vals=$(grep -o '"val_loss":[^,}]*' "$work/one/metrics.jsonl" | cut -d: -f2)
start=$(echo "$vals" | head -n 1)
end=$(echo "$vals" | tail -n 1)
awk -v a="$start" -v b="$base_final" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b) }' \
  || { echo "FAIL: LoRA starts at $start, the base ended at $base_final"; exit 1; }
awk -v a="$start" -v b="$end" 'BEGIN { exit !(b < a - 0.02) }' \
  || { echo "FAIL: LoRA validation loss $start -> $end"; exit 1; }
echo "LoRA: validation loss $start (= the base's $base_final) -> $end"

# Only adapters (and their moments) are checkpointed, not the frozen base. Per layer, rank 8,
# hidden 64, 2 kv heads of 16, ffn 128: q and o 8*64 + 64*8, k and v 8*64 + 32*8, gate and up
# 8*64 + 128*8, down 8*128 + 64*8 = 8,192 values; 2 layers; each as weight, exp_avg and
# exp_avg_sq in fp32: 14 * 2 * 3 = 84 tensors of 3 * 16,384 * 4 = 196,608 bytes.
"$frugal" ckpt verify "$work/one" --step 30 > "$work/verify.log" \
  || { echo "FAIL: ckpt verify"; cat "$work/verify.log"; exit 1; }
grep -q '"tensors":84,"bytes":196608' "$work/verify.log" \
  || { echo "FAIL: the checkpoint is not the adapters alone:"; cat "$work/verify.log"; exit 1; }
echo "checkpoint: the adapters alone ($(cat "$work/verify.log"))"

# With adapter dropout the run still learns, and it is a different run (the masks are drawn).
"$frugal" "${lora[@]}" --lora.dropout=0.1 --train.micro_batch_size=4 --train.out_dir="$work/drop" >/dev/null
dend=$(grep -o '"val_loss":[^,}]*' "$work/drop/metrics.jsonl" | tail -n 1 | cut -d: -f2)
awk -v a="$start" -v b="$dend" 'BEGIN { exit !(b < a - 0.02) }' || { echo "FAIL: dropout run $start -> $dend"; exit 1; }
if cmp -s <(losses "$work/one/metrics.jsonl") <(losses "$work/drop/metrics.jsonl"); then
  echo "FAIL: lora.dropout changed nothing"; exit 1
fi
echo "lora.dropout 0.1: validation loss $start -> $dend"

# Export merges the adapters into the base weights (W += alpha/r B A): the merged model
# evaluates to the LoRA run's final validation loss (up to the merge's rounding).
"$frugal" export --ckpt "$work/one" --out "$work/merged" >/dev/null
"$frugal" train "${common[@]}" --model.hf_path="$work/merged" --train.steps=1 \
  --train.micro_batch_size=4 --train.out_dir="$work/check" >/dev/null
merged=$(head -n 1 "$work/check/metrics.jsonl" | grep -o '"val_loss":[^,}]*' | cut -d: -f2)
awk -v a="$merged" -v b="$end" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' \
  || { echo "FAIL: the merged export evaluates to $merged, the LoRA run ended at $end"; exit 1; }
echo "export: merged model's validation loss $merged = the LoRA run's $end"

# Or the adapters alone, as a PEFT adapter directory (tools/check_peft_export.py loads it with
# the real peft library against the merged export).
"$frugal" export --ckpt "$work/one" --out "$work/peft" --peft >/dev/null
grep -q '"r": 8' "$work/peft/adapter_config.json" && grep -q '"lora_alpha": 16.0' "$work/peft/adapter_config.json" \
  && grep -q '"peft_type": "LORA"' "$work/peft/adapter_config.json" \
  && grep -q "\"base_model_name_or_path\": \"$work/hf\"" "$work/peft/adapter_config.json" \
  || { echo "FAIL: adapter_config.json"; cat "$work/peft/adapter_config.json"; exit 1; }
for name in base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight \
            base_model.model.model.layers.1.mlp.down_proj.lora_B.weight; do
  grep -aq "\"$name\"" "$work/peft/adapter_model.safetensors" || { echo "FAIL: no $name"; exit 1; }
done
if grep -aq '"base_model.model.model.embed_tokens.weight"' "$work/peft/adapter_model.safetensors"; then
  echo "FAIL: base weights in the adapter file"; exit 1
fi
rc=0
"$frugal" export --ckpt "$work/base" --out "$work/nope" --peft > "$work/nope.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "no adapters" "$work/nope.log" || { echo "FAIL: --peft of a full run"; exit 1; }
echo "export --peft: adapter_model.safetensors and adapter_config.json"

"${mpi[@]}" -np 2 "$frugal" "${lora[@]}" --train.micro_batch_size=2 --train.out_dir="$work/two" > /dev/null
rel=$(max_rel "$work/one/metrics.jsonl" "$work/two/metrics.jsonl")
awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: 2 ranks differ from 1 by $rel"; exit 1; }
echo "2 ranks vs 1 rank: largest relative loss difference $rel"

rc=0
# Synchronous saves: the checkpoint before the injected exit is committed when it hits (an
# asynchronous one may still be in flight; tests/integration/async_ckpt.sh covers those).
FRUGAL_INJECT_FAULT=exit:0:16 "$frugal" "${lora[@]}" --ckpt.async=false --train.micro_batch_size=4 \
  --train.out_dir="$work/re" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
"$frugal" "${lora[@]}" --train.micro_batch_size=4 --train.resume=true --train.out_dir="$work/re" > "$work/re.log"
grep -q "resumed from step 15" "$work/re.log" || { echo "FAIL: no resume"; cat "$work/re.log"; exit 1; }
cmp <(losses "$work/one/metrics.jsonl") <(losses "$work/re/metrics.jsonl") \
  || { echo "FAIL: the resumed LoRA run differs"; exit 1; }
echo "resume: the same losses as the straight run"

# The 4-bit bases (NF4: qlora, HQQ: hqq_lora), sharded as bytes: a run starts from the
# quantized base (near the base's loss, not equal), learns, trains the same on 2 ranks, and
# its merged export (adapters on the dequantized base) evaluates to its final loss.
# usage: check_4bit TYPE LOG_LINE STEPS
check_4bit() {
  local type=$1 line=$2 steps=$3 name=$1
  local run=(train "${common[@]}" --model.hf_path="$work/hf" --train.type="$type" --lora.rank=8
             --lora.alpha=16 --train.lr=1e-2 --train.steps="$steps" --train.eval_every=$((steps / 2)))
  "$frugal" "${run[@]}" --train.micro_batch_size=4 --train.out_dir="$work/$name-1" > "$work/$name.log"
  grep -q "$line" "$work/$name.log" || { echo "FAIL: no '$line'"; cat "$work/$name.log"; exit 1; }
  local vals first last merged rel
  vals=$(grep -o '"val_loss":[^,}]*' "$work/$name-1/metrics.jsonl" | cut -d: -f2)
  first=$(echo "$vals" | head -n 1)
  last=$(echo "$vals" | tail -n 1)
  awk -v a="$first" -v b="$base_final" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d > 0 && d < 0.05 * b) }' \
    || { echo "FAIL: $type starts at $first, the base ended at $base_final"; exit 1; }
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.01) }' \
    || { echo "FAIL: $type validation loss $first -> $last"; exit 1; }
  "${mpi[@]}" -np 2 "$frugal" "${run[@]}" --train.micro_batch_size=2 --train.out_dir="$work/$name-2" > /dev/null
  rel=$(max_rel "$work/$name-1/metrics.jsonl" "$work/$name-2/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: $type 2 ranks differ from 1 by $rel"; exit 1; }
  "$frugal" export --ckpt "$work/$name-1" --out "$work/$name-merged" >/dev/null
  "$frugal" train "${common[@]}" --model.hf_path="$work/$name-merged" --train.steps=1 \
    --train.micro_batch_size=4 --train.out_dir="$work/$name-check" >/dev/null
  merged=$(head -n 1 "$work/$name-check/metrics.jsonl" | grep -o '"val_loss":[^,}]*' | cut -d: -f2)
  awk -v a="$merged" -v b="$last" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' \
    || { echo "FAIL: the merged $type export evaluates to $merged, the run ended at $last"; exit 1; }
  echo "$type: validation loss $first (base $base_final) -> $last; 2 ranks vs 1: $rel; merged export $merged"
}
check_4bit qlora "block projections in NF4" 30
check_4bit hqq_lora "block projections in HQQ 4-bit" 20

for bad in "--lora.targets=q_proj,attn:lora.targets" "--lora.rank=0:lora.rank" \
           "--lora.dropout=1:lora.dropout" "--train.type=qqlora:train.type"; do
  rc=0
  "$frugal" "${lora[@]}" "${bad%%:*}" --train.out_dir="$work/bad" > "$work/bad.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] && grep -q "${bad##*:}" "$work/bad.log" \
    || { echo "FAIL: ${bad%%:*} was not refused naming ${bad##*:}"; cat "$work/bad.log"; exit 1; }
done
echo "integration lora: ok"
