#!/usr/bin/env bash
# Hybrid sharding through the CLI, with 4 ranks placed as two nodes (parallel.node_ranks = 2):
# HSDP 2 x 2 and 2 x 1 x 2 (cp 2) train like one rank; metrics.jsonl counts bytes within and
# across the nodes; a checkpoint of HSDP (written by the first replica alone) resumes on 2 flat
# ranks, and one of 2 flat ranks resumes on HSDP with cp 2; GaLore's projected gradients cross
# the nodes in fewer bytes than whole gradient shards, and with clipping off equal one rank.
# usage: hsdp.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
export OMP_NUM_THREADS=1

"$frugal" prepare /usr/share/games/fortunes/fortunes --out "$work/data" --vocab-size 400 >/dev/null
common=(--data.dir="$work/data" --model.hidden_size=40 --model.intermediate_size=72
        --model.num_hidden_layers=2 --model.num_attention_heads=5 --model.num_key_value_heads=1
        --model.vocab_size=403 --model.max_position_embeddings=64 --train.seq_len=24
        --train.lr=5e-3 --train.warmup_steps=2 --train.eval_batches=2 --train.sample_tokens=0
        --train.steps=12 --train.eval_every=6 --optim.eps=1e-6)
two_nodes=(--parallel.node_ranks=2)

same_as() {  # reference run, run, what
  local rel
  rel=$(max_rel "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl")
  awk -v r="$rel" 'BEGIN { exit !(r < 1e-4) }' || { echo "FAIL: $3 differs from one rank by $rel"; exit 1; }
  echo "$3: largest relative loss difference from one rank $rel"
}
# link_bytes of the last step record: "intra inter" (nlohmann::json writes the keys sorted)
link_bytes() {
  grep -o '"link_bytes":{"inter_node":[0-9]*,"intra_node":[0-9]*}' "$1" | tail -1 \
    | sed 's/.*"inter_node":\([0-9]*\),"intra_node":\([0-9]*\)}/\2 \1/'
}

"${mpi[@]}" -np 1 "$frugal" train "${common[@]}" --train.micro_batch_size=4 --train.out_dir="$work/one" >/dev/null

"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${two_nodes[@]}" --train.micro_batch_size=1 \
  --train.out_dir="$work/hsdp" > "$work/hsdp.log"
grep -q "mesh: 4 rank(s) = dp_replicate 2 x dp_shard 2 x cp 1 on 2 node(s)" "$work/hsdp.log" \
  || { echo "FAIL: not a 2 x 2 mesh"; cat "$work/hsdp.log"; exit 1; }
same_as one hsdp "HSDP 2 x 2"
read -r intra inter <<< "$(link_bytes "$work/hsdp/metrics.jsonl")"
[ "$intra" -gt 0 ] && [ "$inter" -gt 0 ] || { echo "FAIL: HSDP link bytes $intra / $inter"; exit 1; }
echo "HSDP 2 x 2: $intra bytes within a node, $inter across, per step (rank 0)"
[ "$(cat "$work/hsdp/ckpt/LATEST")" = step_00000012 ] || { echo "FAIL: no final checkpoint"; exit 1; }

"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${two_nodes[@]}" --parallel.cp=2 \
  --train.micro_batch_size=2 --train.out_dir="$work/hsdp-cp" > "$work/hsdp-cp.log"
grep -q "dp_replicate 2 x dp_shard 1 x cp 2" "$work/hsdp-cp.log" || { echo "FAIL: not 2 x 1 x 2"; exit 1; }
same_as one hsdp-cp "HSDP 2 x 1 x 2"

# Flat ZeRO-3 over both "nodes" (dp_shard = every dp rank): everything crosses them.
"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${two_nodes[@]}" --parallel.dp_shard=4 \
  --train.micro_batch_size=1 --train.steps=2 --train.out_dir="$work/flat" > /dev/null
read -r flat_intra flat_inter <<< "$(link_bytes "$work/flat/metrics.jsonl")"
[ "$flat_intra" -eq 0 ] && [ "$flat_inter" -gt "$inter" ] \
  || { echo "FAIL: flat ZeRO-3 link bytes $flat_intra / $flat_inter vs HSDP's $inter across"; exit 1; }
echo "flat ZeRO-3 over two nodes: $flat_inter bytes across per step (HSDP: $inter)"

# Resume across meshes: HSDP (killed after step 6) on 2 flat ranks.
rc=0
FRUGAL_INJECT_FAULT=exit:1:7 "${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${two_nodes[@]}" \
  --ckpt.async=false --train.micro_batch_size=1 --ckpt.every=6 --train.out_dir="$work/re" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
[ "$(cat "$work/re/ckpt/LATEST")" = step_00000006 ] || { echo "FAIL: no step-6 checkpoint"; exit 1; }
files=$(ls "$work/re/ckpt/step_00000006" | grep -c '^rank_.*\.h5$')
[ "$files" -eq 2 ] || { echo "FAIL: HSDP 2 x 2 wrote $files rank files, not the first replica's 2"; exit 1; }
"${mpi[@]}" -np 2 "$frugal" train "${common[@]}" --train.micro_batch_size=2 --ckpt.every=6 \
  --train.resume=true --train.out_dir="$work/re" > "$work/re.log"
grep -q "resumed from step 6" "$work/re.log" || { echo "FAIL: no resume"; cat "$work/re.log"; exit 1; }
same_as one re "HSDP 2 x 2 resumed on 2 flat ranks"

# And a checkpoint of 2 flat ranks resumed on HSDP 2 x 1 x 2.
rc=0
FRUGAL_INJECT_FAULT=exit:1:7 "${mpi[@]}" -np 2 "$frugal" train "${common[@]}" \
  --ckpt.async=false --train.micro_batch_size=2 --ckpt.every=6 --train.out_dir="$work/re2" >/dev/null 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "FAIL: the injected exit did not stop the run"; exit 1; }
"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${two_nodes[@]}" --parallel.cp=2 \
  --train.micro_batch_size=2 --ckpt.every=6 --train.resume=true --train.out_dir="$work/re2" > "$work/re2.log"
grep -q "resumed from step 6" "$work/re2.log" || { echo "FAIL: no resume"; cat "$work/re2.log"; exit 1; }
same_as one re2 "2 flat ranks resumed on HSDP 2 x 1 x 2"

# GaLore: its projections cross the nodes (fewer bytes than whole shards); without clipping the
# run equals one rank's GaLore.
galore=(--optim.type=galore_adamw --galore.rank=4 --galore.update_proj_gap=5 --optim.grad_clip=0)
"${mpi[@]}" -np 1 "$frugal" train "${common[@]}" "${galore[@]}" --train.micro_batch_size=4 \
  --train.out_dir="$work/galore-one" >/dev/null
"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${galore[@]}" "${two_nodes[@]}" \
  --train.micro_batch_size=1 --train.out_dir="$work/galore" > "$work/galore.log"
grep -q "GaLore's projected matrices as their rank-r projections" "$work/galore.log" \
  || { echo "FAIL: GaLore's projections do not cross the replicas"; cat "$work/galore.log"; exit 1; }
same_as galore-one galore "HSDP 2 x 2 with GaLore's projections"
"${mpi[@]}" -np 4 "$frugal" train "${common[@]}" "${galore[@]}" "${two_nodes[@]}" \
  --parallel.replica_galore_projection=false --train.micro_batch_size=1 \
  --train.out_dir="$work/galore-whole" > /dev/null
same_as galore-one galore-whole "HSDP 2 x 2 with GaLore, whole gradient shards"
read -r _ projected <<< "$(link_bytes "$work/galore/metrics.jsonl")"
read -r _ whole <<< "$(link_bytes "$work/galore-whole/metrics.jsonl")"
[ "$projected" -lt "$whole" ] || { echo "FAIL: GaLore's projections took $projected bytes across, whole shards $whole"; exit 1; }
# Whole shards cross the nodes as AdamW's do: nothing else of GaLore's does.
[ "$whole" -eq "$inter" ] || { echo "FAIL: GaLore with whole shards took $whole bytes across, AdamW $inter"; exit 1; }
echo "GaLore across the nodes: $projected bytes per step projected, $whole as whole shards"
echo "integration hsdp: ok"
