#!/usr/bin/env python3
"""The peer of frugal's CPU training: Hugging Face transformers' LlamaForCausalLM on the same
shape, batch and optimizer (AdamW, fp32, CPU), timed over the same number of steps.
Prints one JSON line. Used by tools/bench/train_cpu_vs_torch; needs torch + transformers."""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
for key, default in [("hidden", 192), ("intermediate", 512), ("layers", 4), ("heads", 6),
                     ("kv_heads", 2), ("vocab", 512), ("seq", 128), ("batch", 8),
                     ("steps", 30), ("warmup", 5), ("threads", 2)]:
    p.add_argument("--" + key, type=int, default=default)
p.add_argument("--tied", type=int, default=1)
a = p.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                     num_hidden_layers=a.layers, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                     max_position_embeddings=max(256, a.seq), tie_word_embeddings=bool(a.tied),
                     attn_implementation="sdpa")
model = LlamaForCausalLM(config).float().train()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))


def train_step():
    opt.zero_grad(set_to_none=True)
    # transformers shifts the labels itself: labels = inputs gives next-token prediction
    out = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return out.loss.item()


for _ in range(a.warmup):
    train_step()
start = time.perf_counter()
for _ in range(a.steps):
    train_step()
elapsed = time.perf_counter() - start
print(json.dumps({"peer": "transformers " + __import__("transformers").__version__ +
                  " / torch " + torch.__version__, "tokens_per_s": a.batch * a.seq * a.steps / elapsed,
                  "threads": a.threads}))
