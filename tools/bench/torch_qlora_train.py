#!/usr/bin/env python3
"""QLoRA with the Hugging Face stack, the peer of `frugal train --train.type=qlora`.

A random-weight LlamaForCausalLM (bf16, SDPA attention) whose decoder projections are replaced by
bitsandbytes' Linear4bit (NF4, double quantization, bf16 compute), PEFT LoRA adapters (fp32) on
the chosen projections, gradient checkpointing, fused torch AdamW over the adapters, on one GPU.
Prints one JSON line: tokens/s over the timed steps and the peak GPU memory reserved by the
caching allocator while training (after the model was built and quantized), and the first
step's loss (LoRA B starts at zero: the base's loss on the batch).

With --model DIR the base is DIR's weights (a save_pretrained directory, tools/bench/qlora_base.py
model) instead of a random one; with --window FILE every step trains on that window
(qlora_base.py window: inputs ids[:seq], shifted labels ids[1:], frugal's inputs and targets)
instead of random ids with labels = ids; with --adapters DIR the adapters start from a PEFT
adapter directory (the initial ones tools/bench/torch_unsloth_train.py --adapters-out wrote).

Used by tools/bench/qlora_vs_peft and tools/bench/qlora_vs_unsloth; needs torch, transformers, peft and bitsandbytes with CUDA.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch


def random_base(a):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                         max_position_embeddings=a.seq, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(a.device):
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    return model


def load_base(path, device):
    """A save_pretrained directory in bf16 on `device`, its shape checked by the caller's use."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=device,
                                                attn_implementation="sdpa")


def load_adapters(model, path):
    """The adapters of a PEFT adapter directory into `model` (a PeftModel with the same
    targets and rank); fails naming what does not match."""
    import peft
    from safetensors.torch import load_file
    state = load_file(str(Path(path) / "adapter_model.safetensors"))
    result = peft.set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        sys.exit(f"torch_qlora_train.py: the adapters of {path} do not match this model: "
                 f"unexpected {result.unexpected_keys[:4]}, missing {missing[:4]}")
    return len(state)


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
    p.add_argument("--model", help="a save_pretrained directory: the base (default: random)")
    p.add_argument("--window", help="qlora_base.py window's window.ids: the batch of every step")
    p.add_argument("--adapters", help="a PEFT adapter directory: the initial adapters")
    a = p.parse_args()
    if a.steps < 0 or a.warmup < 0 or a.steps + a.warmup < 1:
        p.error("--steps and --warmup must be >= 0 and train at least one step together")

    import bitsandbytes as bnb
    import peft
    import transformers

    torch.manual_seed(0)
    model = load_base(a.model, a.device) if a.model else random_base(a)
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
    loaded_adapters = load_adapters(model, a.adapters) if a.adapters else 0
    if a.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.config.use_cache = False
    trainable = [t for t in model.parameters() if t.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4, betas=(0.9, 0.95), weight_decay=0.0,
                                  fused=cuda)
    n_trainable = sum(t.numel() for t in trainable)

    if a.window:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import qlora_base
        ids, shift_labels = (t.to(a.device) for t in qlora_base.read_window(a.window, a.batch, a.seq))
        labels = {"labels": ids, "shift_labels": shift_labels}
    else:
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
        labels = {"labels": ids}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    def step():
        loss = model(input_ids=ids, **labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses = [float(step().detach()) for _ in range(a.warmup)]  # untimed
    sync()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    seconds = time.perf_counter() - start
    if a.steps:
        losses.append(float(loss.detach()))
    print(json.dumps({
        "tokens_per_s": a.steps * a.batch * a.seq / seconds if a.steps else None,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "trainable_parameters": n_trainable, "first_step_loss": losses[0],
        "second_step_loss": losses[1] if len(losses) > 1 else None, "final_loss": losses[-1],
        "loaded_adapter_tensors": loaded_adapters,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "peft": peft.__version__, "bitsandbytes": bnb.__version__,
        "gpu": torch.cuda.get_device_name() if cuda else "cpu"}))


if __name__ == "__main__":
    main()
