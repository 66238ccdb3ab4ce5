#!/usr/bin/env python3
"""QLoRA with Unsloth, the peer of `frugal train --train.type=qlora` in tools/bench/qlora_vs_unsloth
and tools/bench/qlora_long_context.

Unsloth's own 4-bit loader (FastLanguageModel.from_pretrained(DIR, load_in_4bit=True,
dtype=bf16, local_files_only=True): bitsandbytes NF4 with double quantization), its LoRA
(get_peft_model: every projection named, dropout 0, no bias,
use_gradient_checkpointing="unsloth", which offloads the checkpointed activations to host
memory), and a plain PyTorch loop: fused torch AdamW (or bitsandbytes' AdamW8bit, what
Unsloth's notebooks use) over the adapters at a constant lr of 2e-4, betas (0.9, 0.95), no
weight decay, gradients clipped to norm 1, as tools/bench/torch_qlora_train.py does for PEFT.
Every step trains on one fixed batch: the window of `qlora_base.py window` (--window), or one
drawn from --seed; inputs = ids[:seq] and shifted labels ids[1:] in every row, frugal's inputs
and targets. Prints one JSON line: tokens/s over the timed steps, the peak GPU memory reserved
and allocated while training (after the model was loaded), the host's peak RSS over the whole
run and while training, the first step's loss (LoRA B starts at zero: the base's loss on the
batch) and the versions. A CUDA out-of-memory error prints a JSON line with "out_of_memory":
true and exits with status 3 (the long-context bisection reads it).

  torch_unsloth_train.py --model DIR [--window FILE] [--seq S --batch B --rank R ...]
  torch_unsloth_train.py [shape]       a random base (qlora_base.py model) in a temporary directory

Needs torch with CUDA, transformers, unsloth, unsloth_zoo, peft, bitsandbytes (the wheels of
../shared/gpu/peers/README.md; the offline switches it names are set here when unset).
"""
import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qlora_base  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "UNSLOTH_DISABLE_STATISTICS": "1", "UNSLOTH_OFFLINE": "1",
           "UNSLOTH_DISABLE_LLM_COMPRESSOR_AUTOINSTALL": "1", "HF_HUB_ENABLE_HF_TRANSFER": "0",
           # What Unsloth sets when unset; the bench sets it for every peer it compares.
           "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
OOM_EXIT = 3


def parse_size(text):
    """'24GiB', '512MiB' or a byte count."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    return int(text)


def rss_bytes(field):
    """VmRSS or VmHWM of this process (Linux), in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def reset_peak_rss():
    """Start VmHWM again from the current RSS (Linux >= 4.0), so that the peak measured after it
    is the training's, not the loading's. False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def is_out_of_memory(error):
    import torch
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a save_pretrained directory with a tokenizer (default: a "
                   "random base of the shape below, made in a temporary directory)")
    p.add_argument("--window", help="qlora_base.py window's window.ids (default: drawn from --seed)")
    for name, default in [("hidden", 4096), ("intermediate", 11008), ("layers", 32), ("heads", 32),
                          ("kv_heads", 32), ("vocab", 32000), ("seq", 2048), ("batch", 2),
                          ("steps", 10), ("warmup", 3), ("rank", 64), ("seed", 0)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default=TARGETS)
    p.add_argument("--optim", choices=("adamw", "adamw8bit"), default="adamw",
                   help="fused torch AdamW, or bitsandbytes' AdamW8bit (Unsloth's notebooks)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--mem-fraction", type=float,
                     help="torch.cuda.set_per_process_memory_fraction before loading")
    cap.add_argument("--mem-limit", help="the same as a size: 24GiB is 24 GiB of this GPU's memory")
    p.add_argument("--adapters-out", help="write the initial adapters here (PEFT's "
                   "adapter_model.safetensors and adapter_config.json) before the first step")
    a = p.parse_args()
    if a.steps < 0 or a.warmup < 0 or a.steps + a.warmup < 1:
        p.error("--steps and --warmup must be >= 0 and train at least one step together")
    for k, v in OFFLINE.items():
        os.environ.setdefault(k, v)

    temporary = None
    if a.model is None:
        temporary = tempfile.TemporaryDirectory(prefix="unsloth-base-")
        a.model = temporary.name
        shape = argparse.Namespace(out=a.model, hidden=a.hidden, intermediate=a.intermediate,
                                   layers=a.layers, heads=a.heads, kv_heads=a.kv_heads,
                                   vocab=a.vocab, max_positions=max(a.seq, 4096),
                                   rope_theta=10000.0, seed=a.seed, device=None)
        qlora_base.make_model(shape)
    window_dir = None
    if a.window is None:
        window_dir = tempfile.TemporaryDirectory(prefix="unsloth-window-")
        config = json.loads((Path(a.model) / "config.json").read_text())
        qlora_base.make_window(argparse.Namespace(out=window_dir.name, vocab=config["vocab_size"],
                                                  seq=a.seq, seed=a.seed))
        a.window = os.path.join(window_dir.name, "window.ids")

    try:
        result = train(a)
    except Exception as e:  # noqa: BLE001: an out-of-memory error is a result, the rest a failure
        if not is_out_of_memory(e):
            raise
        import torch
        print(json.dumps({"out_of_memory": True, "seq": a.seq, "batch": a.batch,
                          "message": (str(e).splitlines() or [repr(e)])[0][:300],
                          "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
                          "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        sys.stdout.flush()
        for directory in (temporary, window_dir):
            if directory is not None:
                shutil.rmtree(directory.name, ignore_errors=True)
        os._exit(OOM_EXIT)  # no teardown: freeing a half-built model can fail again
    print(json.dumps(result))


def train(a):
    import unsloth  # first: it patches transformers and peft on import
    from unsloth import FastLanguageModel
    import bitsandbytes as bnb
    import peft
    import torch
    import transformers

    if not torch.cuda.is_available():
        sys.exit("torch_unsloth_train.py: Unsloth needs a CUDA GPU")
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = a.mem_fraction
    if a.mem_limit is not None:
        fraction = parse_size(a.mem_limit) / total
    if fraction is not None:
        if not 0 < fraction <= 1:
            sys.exit(f"torch_unsloth_train.py: memory fraction {fraction} is not in (0, 1] "
                     f"(the GPU has {total} bytes)")
        torch.cuda.set_per_process_memory_fraction(fraction)

    model, _tokenizer = FastLanguageModel.from_pretrained(
        a.model, max_seq_length=a.seq, dtype=torch.bfloat16, load_in_4bit=True,
        local_files_only=True)
    model = FastLanguageModel.get_peft_model(
        model, r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, bias="none",
        target_modules=a.targets.split(","), use_gradient_checkpointing="unsloth",
        random_state=a.seed, max_seq_length=a.seq)
    FastLanguageModel.for_training(model)
    if a.adapters_out:
        save_adapters(model, a.adapters_out)

    trainable = [t for t in model.parameters() if t.requires_grad]
    if a.optim == "adamw":
        optimizer = torch.optim.AdamW(trainable, lr=2e-4, betas=(0.9, 0.95), weight_decay=0.0,
                                      fused=True)
    else:
        optimizer = bnb.optim.AdamW8bit(trainable, lr=2e-4, betas=(0.9, 0.95), weight_decay=0.0)
    inputs, labels = qlora_base.read_window(a.window, a.batch, a.seq)
    inputs, labels = inputs.cuda(), labels.cuda()
    embedding = model.get_input_embeddings().weight

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rss_before = rss_bytes("VmRSS")
    peak_reset = reset_peak_rss()

    def step():
        # labels make Unsloth take its fused head + loss (no logits tensor); shift_labels are the
        # targets it then reads, frugal's (every position predicts the window's next id).
        loss = model(input_ids=inputs, labels=inputs, shift_labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses = []
    for _ in range(a.warmup):
        losses.append(float(step().detach()))  # untimed: the first step compiles
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if a.steps:
        losses.append(float(loss.detach()))
    return {
        "tokens_per_s": a.steps * a.batch * a.seq / seconds if a.steps else None,
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "memory_fraction": fraction, "gpu_total_bytes": total,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "train_peak_rss_bytes": rss_bytes("VmHWM") if peak_reset else None,
        "rss_before_training_bytes": rss_before,
        "first_step_loss": losses[0], "second_step_loss": losses[1] if len(losses) > 1 else None,
        "final_loss": losses[-1], "trainable_parameters": sum(t.numel() for t in trainable),
        "trainable_dtype": str(trainable[0].dtype), "embedding_device": str(embedding.device),
        "seq": a.seq, "batch": a.batch, "rank": a.rank, "alpha": a.alpha, "optim": a.optim,
        "steps": a.steps, "warmup": a.warmup,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "unsloth": unsloth.__version__, "peft": peft.__version__,
        "bitsandbytes": bnb.__version__, "gpu": torch.cuda.get_device_name(),
        "pytorch_alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF")}


def save_adapters(model, out):
    """The adapters as PEFT writes them (adapter_model.safetensors: base_model.model....lora_A /
    lora_B.weight; adapter_config.json), fp32, so that tools/bench/torch_qlora_train.py --adapters
    starts from the same A (B is zero)."""
    import peft
    from safetensors.torch import save_file
    Path(out).mkdir(parents=True, exist_ok=True)
    state = peft.get_peft_model_state_dict(model)
    save_file({k: v.detach().float().cpu().contiguous() for k, v in state.items()},
              os.path.join(out, "adapter_model.safetensors"))
    config = model.peft_config["default"].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    Path(out, "adapter_config.json").write_text(json.dumps(config, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
