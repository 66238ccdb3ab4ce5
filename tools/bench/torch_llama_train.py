#!/usr/bin/env python3
"""The peer of frugal's training: Hugging Face transformers' LlamaForCausalLM on the same shape,
batch and optimizer, timed over the same number of steps. Prints one JSON line. Needs torch +
transformers.
  --device cpu (default, tools/bench/train_cpu_vs_torch): fp32 weights, torch.optim.AdamW.
  --device cuda (tools/bench/train_vs_torch): bf16 weights on one GPU, SDPA attention,
    torch.optim.AdamW(fused=True), peak GPU memory reported; --grad-ckpt 1 recomputes each
    decoder layer in the backward (gradient_checkpointing_enable, use_reentrant=False);
    --compile 1 wraps the model in torch.compile; --float8 1 converts the decoder layers'
    linears to torchao's float8 training (tensorwise scaling, the lm_head stays bf16), the
    peer of frugal's [fp8] (tools/bench/fp8_vs_bf16)."""
import argparse
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
for key, default in [("hidden", 192), ("intermediate", 512), ("layers", 4), ("heads", 6),
                     ("kv_heads", 2), ("vocab", 512), ("seq", 128), ("batch", 8),
                     ("steps", 30), ("warmup", 5), ("threads", 2)]:
    p.add_argument("--" + key, type=int, default=default)
p.add_argument("--tied", type=int, default=1)
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
p.add_argument("--grad-ckpt", type=int, default=0, help="1: activation checkpointing (cuda only)")
p.add_argument("--compile", type=int, default=0, help="1: torch.compile the model (cuda only)")
p.add_argument("--float8", type=int, default=0,
               help="1: torchao float8 training of the decoder linears (cuda only)")
a = p.parse_args()
cuda = a.device == "cuda"
if cuda and not torch.cuda.is_available():
    sys.exit("torch_llama_train.py: --device cuda, but torch " + torch.__version__ +
             " sees no CUDA device (torch.cuda.is_available() is false)")
if a.grad_ckpt and not cuda:
    sys.exit("torch_llama_train.py: --grad-ckpt is for --device cuda")

torch.set_num_threads(a.threads)
torch.manual_seed(0)
config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                     num_hidden_layers=a.layers, num_attention_heads=a.heads,
                     num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                     max_position_embeddings=max(256, a.seq), tie_word_embeddings=bool(a.tied),
                     rope_theta=10000.0, rms_norm_eps=1e-5, attn_implementation="sdpa")
if cuda:
    # Built on the GPU in bf16 directly: initialising 1.1B parameters on the CPU takes longer
    # than the timed steps.
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).train()
    if a.grad_ckpt:
        # Every decoder layer recomputed in the backward; transformers 5.2x renamed the call
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if a.float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        # Tensorwise (per-tensor) dynamic scaling, torchao's default recipe; the output head
        # stays bf16, as frugal's does.
        convert_to_float8_training(
            model, config=Float8LinearConfig(),
            module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    if a.compile:
        model = torch.compile(model)
else:
    model = LlamaForCausalLM(config).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
extra = {"use_cache": False} if cuda else {}
tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=a.device)


def train_step():
    opt.zero_grad(set_to_none=True)
    # transformers shifts the labels itself: labels = inputs gives next-token prediction
    # (on the GPU without a KV cache, which training does not use; the CPU mode as it was)
    out = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1], **extra)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    # On the GPU the loss stays a tensor: reading it every step would stall the queue.
    return out.loss.detach() if cuda else out.loss.item()


for _ in range(a.warmup):
    train_step()
if cuda:
    torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(a.steps):
    loss = train_step()
if cuda:
    torch.cuda.synchronize()
elapsed = time.perf_counter() - start
result = {"peer": "transformers " + __import__("transformers").__version__ + " / torch " +
          torch.__version__, "tokens_per_s": a.batch * a.seq * a.steps / elapsed}
if cuda:
    result.update({"device": torch.cuda.get_device_name(), "dtype": "bfloat16",
                   "attn_implementation": "sdpa", "optimizer": "AdamW(fused=True)",
                   "grad_ckpt": bool(a.grad_ckpt), "compile": bool(a.compile),
                   "float8": ("torchao " + __import__("torchao").__version__
                              + " tensorwise") if a.float8 else None,
                   "n_params": sum(t.numel() for t in model.parameters()),
                   "final_loss": float(loss),
                   "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
                   "max_memory_reserved_bytes": torch.cuda.max_memory_reserved()})
else:
    result["threads"] = a.threads
print(json.dumps(result))
