#!/usr/bin/env bash
# `frugal plan` through the CLI: a .cfg, a Hugging Face config.json and its directory give the
# same shape; --json is one object whose pick fits; bad input stops with a message naming the
# problem and a non-zero exit; nothing fitting says so (exit 3).
# usage: plan.sh FRUGAL_BINARY REPO_ROOT
source "$(dirname "${BASH_SOURCE[0]}")/common.bash"
repo=$2

"$frugal" plan --help | grep -q -- "--link-inter" || { echo "FAIL: --help"; exit 1; }

# The 70B preset on 2 x 24 GiB: only offload = params fits (doc/benchmarks.md).
out=$("$frugal" plan "$repo/configs/llama2-70b-qlora-2x24g.cfg" --gpus 2 --gpu-mem 24GiB \
  --host-mem 128GiB --link-intra 25GB/s)
echo "$out" | grep -q "^recommended: qlora, adamw fp32, full, offload params" \
  || { echo "FAIL: 70B pick"; echo "$out"; exit 1; }

# A Hugging Face config.json (and its directory) for TinyLlama's shape: the same plan as the .cfg.
mkdir -p "$work/hf"
cat > "$work/hf/config.json" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
 "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
 "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
 "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
 "hidden_act": "silu"}
JSON
keys=(--train.seq_len=2048 --train.micro_batch_size=4 --train.grad_accum_steps=1)
a=$("$frugal" plan "$repo/configs/tinyllama-1b.cfg" --gpus 1 --gpu-mem 24GiB "${keys[@]}" --json)
b=$("$frugal" plan "$work/hf/config.json" --gpus 1 --gpu-mem 24GiB "${keys[@]}" --json)
c=$("$frugal" plan "$work/hf" --gpus=1 --gpu-mem=24GiB "${keys[@]}" --json)
[ "$a" = "$b" ] && [ "$b" = "$c" ] || { echo "FAIL: .cfg, config.json and directory differ"; exit 1; }
echo "$a" | grep -q '"picked":0' || { echo "FAIL: no pick in --json"; echo "$a"; exit 1; }
echo "$a" | grep -q '"found":true' || { echo "FAIL: --json found"; exit 1; }

# Nothing fits: exit 3 and a sentence.
rc=0
out=$("$frugal" plan "$repo/configs/llama2-70b-qlora-2x24g.cfg" --gpus 1 --gpu-mem 4GiB \
  --host-mem 16GiB) || rc=$?
[ $rc -eq 3 ] && echo "$out" | grep -q "nothing fits" || { echo "FAIL: nothing fits (rc $rc)"; exit 1; }

# Bad input: each stops with a message naming the problem.
expect_error() {
  local pattern=$1; shift
  local err rc=0
  err=$("$frugal" plan "$@" 2>&1 >/dev/null) || rc=$?
  [ $rc -ne 0 ] || { echo "FAIL: '$*' succeeded"; exit 1; }
  echo "$err" | grep -q -- "$pattern" || { echo "FAIL: '$*' said: $err"; exit 1; }
}
cfg=$repo/configs/tinyllama-1b.cfg
expect_error "needs --gpus" "$cfg" --gpu-mem 24GiB
expect_error "needs --gpu-mem" "$cfg" --gpus 1
expect_error "needs --link-intra" "$cfg" --gpus 2 --gpu-mem 24GiB
expect_error "needs --link-inter" "$cfg" --gpus 2 --nodes 2 --gpu-mem 24GiB --link-intra 25GB/s
expect_error "option '--gpu-mem': '24 lots'" "$cfg" --gpus 1 --gpu-mem "24 lots"
expect_error "option '--link-intra': '25 furlongs'" "$cfg" --gpus 2 --gpu-mem 24GiB --link-intra "25 furlongs"
expect_error "option '--gpus': '0'" "$cfg" --gpus 0 --gpu-mem 24GiB
expect_error "option '--gpus': 2000000 is more than 1,000,000" "$cfg" --gpus 2000000 --gpu-mem 24GiB
expect_error "option '--host-mem': a machine of 0 bytes" "$cfg" --gpus 1 --gpu-mem 24GiB --host-mem 0
expect_error "unknown option '--gpu'" "$cfg" --gpu 1 --gpu-mem 24GiB
expect_error "unknown config key 'train.nope'" "$cfg" --gpus 1 --gpu-mem 24GiB --train.nope=1
expect_error "'$work/missing.cfg' does not exist" "$work/missing.cfg" --gpus 1 --gpu-mem 24GiB
expect_error "needs a model" --gpus 1 --gpu-mem 24GiB
mkdir -p "$work/empty"
expect_error "without config.json" "$work/empty" --gpus 1 --gpu-mem 24GiB
expect_error "parallel.cp" "$cfg" --gpus 2 --gpu-mem 24GiB --link-intra 25GB/s --parallel.cp=4
echo '{"model_type": "gpt2"}' > "$work/gpt2.json"
expect_error "gpt2.json" "$work/gpt2.json" --gpus 1 --gpu-mem 24GiB
echo "plan: ok"
