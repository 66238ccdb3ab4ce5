#!/usr/bin/env python3
"""Checks that a directory written by `frugal export` loads in transformers and computes what
frugal computes: the logits of every position (frugal eval --logits-out), the loss, and the
greedy continuation; and, when the export has a tokenizer.model, that transformers'
tokenizer encodes text to the ids frugal uses (frugal generate --prompt ... --ids).

Not part of CI (CI has no torch). Run it with a venv that has torch and transformers:
  /work/venv/bin/python tools/check_hf_export.py --frugal build/frugal --export OUT_DIR

Exits non-zero when anything differs beyond the tolerances.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM

SAMPLE_TEXT = ["Fortune favors the bold.", "A penny saved is a penny earned, they say."]


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frugal", required=True, help="the frugal executable")
    parser.add_argument("--export", required=True, help="a directory written by frugal export")
    parser.add_argument("--lines", type=int, default=4, help="random token sequences to check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--atol", type=float, default=1e-4, help="logits tolerance")
    args = parser.parse_args()

    # The weights in float32 whatever the file holds: frugal computes in fp32 on the CPU.
    model = AutoModelForCausalLM.from_pretrained(args.export, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    config = model.config
    print(f"transformers loaded {args.export}: {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")

    rng = np.random.default_rng(args.seed)
    max_len = min(config.max_position_embeddings, 40)
    lines = [rng.integers(0, config.vocab_size, size=rng.integers(2, max_len + 1)).tolist()
             for _ in range(args.lines)]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tokens_path = os.path.join(tmp, "tokens.txt")
        logits_path = os.path.join(tmp, "logits.f32")
        with open(tokens_path, "w") as f:
            for line in lines:
                f.write(" ".join(map(str, line)) + "\n")
        result = json.loads(run([args.frugal, "eval", "--hf-model", args.export, "--tokens",
                                 tokens_path, "--logits-out", logits_path]))
        frugal_logits = np.fromfile(logits_path, dtype="<f4").reshape(-1, config.vocab_size)

    hf_rows, loss_sum, count = [], 0.0, 0
    with torch.no_grad():
        for line in lines:
            ids = torch.tensor([line])
            out = model(ids, labels=ids)
            hf_rows.append(out.logits[0].float().numpy())
            loss_sum += float(out.loss) * (len(line) - 1)
            count += len(line) - 1
    hf_logits = np.concatenate(hf_rows)
    err = float(np.abs(hf_logits - frugal_logits).max())
    hf_loss = loss_sum / count
    rel = abs(result["loss"] - hf_loss) / hf_loss
    print(f"logits: max abs err {err:.3g} over {hf_logits.shape}; loss frugal {result['loss']:.9f} "
          f"transformers {hf_loss:.9f} (rel err {rel:.3g}); tokens {result['tokens']} / {count}")
    ok &= err < args.atol and rel < 1e-5 and result["tokens"] == count

    prompt = lines[0][:4]
    new = min(12, config.max_position_embeddings - len(prompt))
    with torch.no_grad():
        hf_greedy = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                                   pad_token_id=config.eos_token_id)[0].tolist()
    frugal_greedy = list(map(int, run([args.frugal, "generate", "--hf-model", args.export,
                                       "--prompt-ids", " ".join(map(str, prompt)),
                                       "--max-new-tokens", str(new), "--ids"]).split()))
    print(f"greedy: frugal {frugal_greedy}\n        transformers {hf_greedy}")
    ok &= frugal_greedy == hf_greedy

    if os.path.exists(os.path.join(args.export, "tokenizer.model")):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(args.export)
        for text in SAMPLE_TEXT:
            hf_ids = tokenizer(text).input_ids
            frugal_ids = list(map(int, run([args.frugal, "generate", "--hf-model", args.export,
                                            "--prompt", text, "--max-new-tokens", "0",
                                            "--ids"]).split()))
            same = hf_ids == frugal_ids
            print(f"tokenizer ({type(tokenizer).__name__}) on {text!r}: "
                  f"{'same ids' if same else f'frugal {frugal_ids} transformers {hf_ids}'}")
            ok &= same

    print("check_hf_export: " + ("ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
