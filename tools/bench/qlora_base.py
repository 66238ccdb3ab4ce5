#!/usr/bin/env python3
"""The shared inputs of the QLoRA benches against Unsloth and PEFT (tools/bench/qlora_vs_unsloth,
tools/bench/qlora_long_context): one random base and one batch that frugal, Unsloth and
transformers + PEFT all read, so that their first steps' losses can be compared.

  qlora_base.py model --out DIR [shape] [--seed N] [--device D]
      a random LlamaForCausalLM (bf16, transformers' initialisation) written with
      save_pretrained, with a tokenizer beside it (tests/fixtures/chat/llama3_1: Unsloth refuses
      a directory without one; its pad token is named so that Unsloth adds none and keeps the
      vocabulary). DIR/shape.json records the shape, to reuse the directory.
  qlora_base.py context --model DIR --out DIR2 --max-positions P
      DIR's weights (symbolic links) under a config.json whose max_position_embeddings is P:
      the long-context runs' base without a second copy of the weights.
  qlora_base.py window --out DIR --vocab V --seq S [--seed N]
      one window of S + 1 random token ids: DIR/window.ids (one line) for the Python peers, and
      DIR/data/ for frugal (train.tok and val.tok holding that window alone, the tokenizer). A
      token file of exactly S + 1 ids has one training window (data/sampler.h: windows start at
      multiples of train.seq_len), so every row of every frugal batch is that window; the peers
      take inputs = ids[:S] and shifted labels = ids[1:], frugal's inputs and targets.

Needs torch and transformers for `model`; `context` and `window` need only the standard library.
"""
import argparse
import json
import os
import random
import shutil
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "tests" / "fixtures" / "chat" / "llama3_1"
# The fixture tokenizer's special ids (its tokenizer.json): bos, eos and the pad Unsloth looks for.
BOS, EOS, PAD = 3150, 3151, 3154
PAD_TOKEN = "<|finetune_right_pad_id|>"
SHAPE_KEYS = ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab", "max_positions",
              "rope_theta", "seed")


def make_model(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if a.vocab <= PAD:
        sys.exit(f"qlora_base.py: --vocab {a.vocab} must exceed the tokenizer's ids (up to {PAD})")
    out = Path(a.out)
    shape = {k: getattr(a, k) for k in SHAPE_KEYS}
    if (out / "shape.json").exists() and json.loads((out / "shape.json").read_text()) == shape:
        print(f"qlora_base.py: {out} already holds this base", file=sys.stderr)
        return
    if out.exists():
        shutil.rmtree(out)
    torch.manual_seed(a.seed)
    config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                         max_position_embeddings=a.max_positions, rope_theta=a.rope_theta,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=BOS,
                         eos_token_id=EOS, pad_token_id=PAD)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):  # an 8B model initialises in seconds on a GPU, minutes on a CPU
        model = LlamaForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(out, max_shard_size="4GB")
    shutil.copy(TOKENIZER / "tokenizer.json", out / "tokenizer.json")
    tokenizer_config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    tokenizer_config["pad_token"] = PAD_TOKEN
    tokenizer_config["model_max_length"] = a.max_positions
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1) + "\n")
    # Last: a directory without it is remade.
    (out / "shape.json").write_text(json.dumps(shape) + "\n")


def make_context(a):
    src, out = Path(a.model).resolve(), Path(a.out)
    if not (src / "config.json").exists():
        sys.exit(f"qlora_base.py: {src} holds no config.json (make it with `qlora_base.py model`)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "tokenizer_config.json"):
            (out / f.name).symlink_to(f)
    for name, key in (("config.json", "max_position_embeddings"),
                      ("tokenizer_config.json", "model_max_length")):
        j = json.loads((src / name).read_text())
        j[key] = a.max_positions
        (out / name).write_text(json.dumps(j, indent=1) + "\n")


def write_token_file(path, ids, vocab):
    """frugal's token file (src/data/token_file.h, version 2): one text document, no roles."""
    token_bytes = 2 if vocab <= 65536 else 4
    header = struct.pack("<8sIIQQIiiIII8x", b"FRUGTOK1", 2, token_bytes, len(ids), 1, vocab, -1,
                         EOS, 64, 1, 0)
    assert len(header) == 64
    body = struct.pack("<%d%s" % (len(ids), "H" if token_bytes == 2 else "I"), *ids)
    body += b"\0" * (-len(body) % 8)
    with open(path, "wb") as f:
        f.write(header + body + struct.pack("<QQ", 0, len(ids)))


def make_window(a):
    out = Path(a.out)
    (out / "data").mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    ids = [rng.randrange(a.vocab) for _ in range(a.seq + 1)]
    (out / "window.ids").write_text(" ".join(map(str, ids)) + "\n")
    for name in ("train.tok", "val.tok"):
        write_token_file(out / "data" / name, ids, a.vocab)
    shutil.copy(TOKENIZER / "tokenizer.json", out / "data" / "tokenizer.json")


def read_window(path, batch, seq):
    """The first seq + 1 ids of the window of `qlora_base.py window` (frugal's first window of
    seq_len seq) as [batch, seq] inputs and shifted labels (torch)."""
    import torch
    ids = [int(t) for t in Path(path).read_text().split()]
    if len(ids) < seq + 1:
        sys.exit(f"{path} holds {len(ids)} ids, fewer than seq + 1 = {seq + 1}")
    row = torch.tensor(ids[:seq + 1], dtype=torch.long)
    return row[:seq].repeat(batch, 1), row[1:].repeat(batch, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("model")
    m.add_argument("--out", required=True)
    for name, default in [("hidden", 4096), ("intermediate", 11008), ("layers", 32),
                          ("heads", 32), ("kv_heads", 32), ("vocab", 32000),
                          ("max_positions", 4096), ("seed", 0)]:
        m.add_argument("--" + name, type=int, default=default)
    m.add_argument("--rope_theta", type=float, default=10000.0)
    m.add_argument("--device", default=None, help="where to initialise (default: cuda if any)")
    c = sub.add_parser("context")
    c.add_argument("--model", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--max-positions", dest="max_positions", type=int, required=True)
    w = sub.add_parser("window")
    w.add_argument("--out", required=True)
    w.add_argument("--vocab", type=int, required=True)
    w.add_argument("--seq", type=int, required=True)
    w.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    {"model": make_model, "context": make_context, "window": make_window}[a.command](a)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
