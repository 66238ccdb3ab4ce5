#!/usr/bin/env python3
"""The peer of frugal's GaLore: Hugging Face transformers' LlamaForCausalLM trained with
galore-torch's GaLoreAdamW (proj_type std, its exact SVD every update_proj_gap steps, on the
attention and MLP Linear weights as its README selects them; the rest in the same optimizer
without projection), or with torch.optim.AdamW(fused=True) as the baseline. Times every step
(synchronized) and prints one JSON line: tokens/s over all timed steps (refreshes included),
the median, p99 and largest step time, the optimizer state's bytes (moments and projectors, from
the optimizer's state), and the peak GPU memory. Needs torch, transformers and galore-torch.
  --device cuda (tools/bench/galore_vs_torch): bf16 weights, SDPA attention.
  --device cpu: fp32 weights, for a quick check of the script on a small shape."""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
for key, default in [("hidden", 2048), ("intermediate", 5632), ("layers", 22), ("heads", 32),
                     ("kv_heads", 4), ("vocab", 32000), ("seq", 2048), ("batch", 4),
                     ("steps", 400), ("warmup", 5), ("threads", 2), ("rank", 512),
                     ("gap", 200)]:
    p.add_argument("--" + key, type=int, default=default)
p.add_argument("--scale", type=float, default=0.25)
p.add_argument("--optimizer", choices=["galore", "adamw"], default="galore")
p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
a = p.parse_args()
cuda = a.device == "cuda"
if cuda and not torch.cuda.is_available():
    sys.exit("torch_galore_train.py: --device cuda, but torch sees no CUDA device")

torch.set_num_threads(a.threads)
torch.manual_seed(0)
config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                     num_hidden_layers=a.layers, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                     max_position_embeddings=max(256, a.seq), tie_word_embeddings=False,
                     rope_theta=10000.0, rms_norm_eps=1e-5, attn_implementation="sdpa")
if cuda:
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).train()
else:
    model = LlamaForCausalLM(config).float().train()

if a.optimizer == "galore":
    from galore_torch import GaLoreAdamW
    # galore-torch's README: the Linear weights of modules named attn or mlp.
    galore_params = [m.weight for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and ("attn" in name or "mlp" in name)]
    ids = {id(t) for t in galore_params}
    regular = [t for t in model.parameters() if id(t) not in ids]
    opt = GaLoreAdamW([{"params": regular},
                       {"params": galore_params, "rank": a.rank, "update_proj_gap": a.gap,
                        "scale": a.scale, "proj_type": "std"}],
                      lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, no_deprecation_warning=True)
    described = (f"galore-torch GaLoreAdamW rank {a.rank} gap {a.gap} scale {a.scale} on "
                 f"{len(galore_params)} matrices")
else:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=cuda)
    described = "AdamW(fused=True)" if cuda else "AdamW"
extra = {"use_cache": False} if cuda else {}
tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=a.device)


def train_step():
    opt.zero_grad(set_to_none=True)
    out = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1], **extra)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return out.loss.detach()


def sync():
    if cuda:
        torch.cuda.synchronize()


for _ in range(a.warmup):
    train_step()
sync()
times = []
for _ in range(a.steps):
    start = time.perf_counter()
    loss = train_step()
    sync()  # each step timed whole: a refresh shows as the step that pays for it
    times.append(time.perf_counter() - start)


def state_bytes():
    total = 0
    for state in opt.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                total += value.numel() * value.element_size()
            elif hasattr(value, "ortho_matrix") and torch.is_tensor(value.ortho_matrix):
                total += value.ortho_matrix.numel() * value.ortho_matrix.element_size()
    return total


ordered = sorted(times)
result = {"peer": "transformers " + __import__("transformers").__version__ + " / torch " +
          torch.__version__, "optimizer": described,
          "tokens_per_s": a.batch * a.seq * a.steps / sum(times),
          "median_step_s": statistics.median(times),
          "p99_step_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
          "max_step_s": ordered[-1], "optimizer_state_bytes": state_bytes(),
          "final_loss": float(loss)}
if a.optimizer == "galore":
    import importlib.metadata
    result["galore_torch"] = importlib.metadata.version("galore-torch")
if cuda:
    result.update({"device": torch.cuda.get_device_name(), "dtype": "bfloat16",
                   "max_memory_reserved_bytes": torch.cuda.max_memory_reserved()})
print(json.dumps(result))
