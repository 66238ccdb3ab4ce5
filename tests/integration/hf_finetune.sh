#!/usr/bin/env bash
# Training from a Hugging Face directory (--model.hf_path): a frugal run is exported, then a
# new run starts from the export on 1 and on 2 ranks (each rank reading only its rows); the
# starting validation loss equals the first run's final one, and training goes on from there.
# usage: hf_finetune.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --train.seq_len=24 --train.lr=3e-3
        --train.warmup_steps=2 --train.eval_batches=3 --train.sample_tokens=0)
"$frugal" train "${common[@]}" --model.hidden_size=40 --model.intermediate_size=72 \
  --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1 \
  --model.vocab_size=400 --model.max_position_embeddings=64 --train.steps=8 --train.micro_batch_size=2 \
  --train.out_dir="$work/base" >/dev/null
"$frugal" export --ckpt "$work/base" --out "$work/hf" >/dev/null
final=$(grep '"val_loss"' "$work/base/metrics.jsonl" | tail -1 | grep -o '"val_loss":[^,}]*' | cut -d: -f2)

for ranks in 1 2; do
  # The [model] keys given here are wrong on purpose: config.json must win. The global batch
  # (ranks x micro_batch_size) stays 2, so the validation windows are the same.
  mpirun --oversubscribe --bind-to none -np $ranks "$frugal" train "${common[@]}" \
    --train.micro_batch_size=$((2 / ranks)) \
    --model.hf_path="$work/hf" --model.hidden_size=999 --train.steps=4 \
    --train.out_dir="$work/ft$ranks" > "$work/ft$ranks.log"
  start=$(head -1 "$work/ft$ranks/metrics.jsonl" | grep -o '"val_loss":[^,}]*' | cut -d: -f2)
  awk -v a="$start" -v b="$final" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * b) }' \
    || { echo "FAIL: $ranks rank(s): starting val_loss $start, the exported run ended at $final"; exit 1; }
  grep -q "weights: $work/hf" "$work/ft$ranks.log" || { echo "FAIL: no load message"; exit 1; }
  echo "ranks $ranks: start val_loss $start = exported run's final $final"
done

rc=0
"$frugal" train "${common[@]}" --model.hf_path="$work/nowhere" --train.out_dir="$work/bad" \
  > "$work/bad.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "nowhere" "$work/bad.log" || { echo "FAIL: a missing hf_path was not reported"; cat "$work/bad.log"; exit 1; }
# Finite weights whose forward pass overflows (the final norm at 3e38): the run stops at its
# first validation, naming the loss, instead of writing "val_loss": null.
mkdir "$work/huge" && cp "$work/hf/"* "$work/huge/"
perl -e 'open my $f, "+<", $ARGV[0] or die; binmode $f; read $f, my $len, 8;
         my $n = unpack "Q<", $len; read $f, my $h, $n;
         $h =~ /"model\.norm\.weight":\{[^}]*"data_offsets":\[(\d+),(\d+)\]/ or die;
         seek $f, 8 + $n + $1, 0; print $f pack("f<", 3e38) x (($2 - $1) / 4);' \
  "$work/huge/model.safetensors"
rc=0
"$frugal" train "${common[@]}" --model.hf_path="$work/huge" --train.micro_batch_size=2 \
  --train.steps=2 --train.out_dir="$work/huge-run" > "$work/huge.log" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -q "the validation loss is -*nan" "$work/huge.log" \
  || { echo "FAIL: a NaN validation loss gave exit $rc"; cat "$work/huge.log"; exit 1; }
! grep -q null "$work/huge-run/metrics.jsonl" || { echo "FAIL: metrics.jsonl holds a null loss"; exit 1; }
echo "integration hf_finetune: ok"
