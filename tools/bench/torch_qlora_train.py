#!/usr/bin/env python3
"""QLoRA with the Hugging Face stack, the peer of `frugal train --train.type=qlora`.

A random-weight LlamaForCausalLM (bf16, SDPA attention) whose decoder projections are replaced by
bitsandbytes' Linear4bit (NF4, double quantization, bf16 compute), PEFT LoRA adapters (fp32) on
the chosen projections, gradient checkpointing, fused torch AdamW over the adapters, on one GPU.
Prints one JSON line: tokens/s over the timed steps and the peak GPU memory reserved by the
caching allocator while training (after the model was built and quantized).

Used by tools/bench/qlora_vs_peft; needs torch, transformers, peft and bitsandbytes with CUDA.
"""
import argparse
import json
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in [("hidden", 4096), ("intermediate", 11008), ("layers", 32), ("heads", 32),
                          ("kv_heads", 32), ("vocab", 32000), ("seq", 2048), ("batch", 2),
                          ("steps", 10), ("warmup", 3), ("rank", 64)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    p.add_argument("--grad-ckpt", type=int, default=1)
    p.add_argument("--device", default="cuda", help="cuda; cpu only to try the script out")
    a = p.parse_args()

    import bitsandbytes as bnb
    import peft
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                         max_position_embeddings=a.seq, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(a.device):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)

    # The base's projections into NF4 with double quantization (bitsandbytes quantizes a
    # Params4bit when it is moved to the GPU), one matrix at a time.
    targets = a.targets.split(",")
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, linear in list(parent.named_children()):
                if not isinstance(linear, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False,
                                      compute_dtype=torch.bfloat16, compress_statistics=True,
                                      quant_type="nf4", device="meta")
                q.weight = bnb.nn.Params4bit(linear.weight.data.cpu(), requires_grad=False,
                                             compress_statistics=True, quant_type="nf4").to(a.device)
                setattr(parent, name, q)
                del linear
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()

    lora = peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, bias="none",
                           target_modules=targets, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    if a.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.config.use_cache = False
    trainable = [t for t in model.parameters() if t.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4, betas=(0.9, 0.95), weight_decay=0.0,
                                  fused=cuda)
    n_trainable = sum(t.numel() for t in trainable)

    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "tokens_per_s": a.steps * a.batch * a.seq / seconds,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "trainable_parameters": n_trainable, "final_loss": float(loss.detach()),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "peft": peft.__version__, "bitsandbytes": bnb.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu"}))


if __name__ == "__main__":
    main()
