#!/usr/bin/env python3
"""The peer of `frugal eval` (tools/bench/eval_vs_torch): makes a random Llama model of the
given shape as a Hugging Face directory (bf16 safetensors, --make DIR) with token lines of
random ids (DIR/tokens.txt), or evaluates that directory with transformers (--eval DIR):
each line on its own from position 0, as frugal eval runs it, bf16 weights, SDPA attention,
one GPU; prints one JSON line {"loss", "tokens", "seconds", "tokens_per_s"} (the timed pass
after one untimed warm-up pass). Needs torch + transformers (+ CUDA for --eval on cuda)."""
import argparse
import json
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--make", metavar="DIR")
p.add_argument("--eval", metavar="DIR")
for key, default in [("hidden", 2048), ("intermediate", 5632), ("layers", 22), ("heads", 32),
                     ("kv_heads", 4), ("vocab", 32000), ("seq", 2048), ("lines", 8)]:
    p.add_argument("--" + key, type=int, default=default)
p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
a = p.parse_args()
if bool(a.make) == bool(a.eval):
    sys.exit("torch_llama_eval.py: give exactly one of --make DIR or --eval DIR")
dev = torch.device(a.device)
if a.device == "cuda" and not torch.cuda.is_available():
    sys.exit("torch_llama_eval.py: --device cuda, but torch sees no CUDA device")

if a.make:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                         max_position_embeddings=a.seq, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    with torch.device(dev):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(a.make)
    gen = torch.Generator().manual_seed(1)
    with open(os.path.join(a.make, "tokens.txt"), "w") as f:
        for _ in range(a.lines):
            ids = torch.randint(0, a.vocab, (a.seq,), generator=gen)
            f.write(" ".join(str(int(t)) for t in ids) + "\n")
    sys.exit(0)

model = LlamaForCausalLM.from_pretrained(a.eval, dtype=torch.bfloat16, attn_implementation="sdpa")
model = model.to(dev).eval()
with open(os.path.join(a.eval, "tokens.txt")) as f:
    lines = [[int(t) for t in line.split()] for line in f if line.strip()]


def run():
    loss_sum, count = 0.0, 0
    with torch.no_grad():
        for line in lines:
            ids = torch.tensor([line], device=dev)
            out = model(ids, labels=ids)
            loss_sum += float(out.loss) * (len(line) - 1)
            count += len(line) - 1
    return loss_sum / count, count


run()  # warm-up: kernels chosen, memory pools filled
if a.device == "cuda":
    torch.cuda.synchronize()
start = time.perf_counter()
loss, count = run()
if a.device == "cuda":
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
tokens = sum(len(line) for line in lines)
print(json.dumps({"loss": loss, "tokens": count, "seconds": seconds,
                  "tokens_per_s": tokens / seconds}))
