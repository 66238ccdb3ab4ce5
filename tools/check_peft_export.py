#!/usr/bin/env python3
"""Checks a `frugal export --peft` adapter directory with the real PEFT library: the base model
(transformers) with the adapters applied by peft.PeftModel must give the same logits as
frugal's merged export of the same run. Not part of CI (needs torch, transformers and peft).
usage: check_peft_export.py BASE_HF_DIR PEFT_DIR MERGED_HF_DIR"""
import json
import sys

import torch
from peft import PeftModel
from transformers import LlamaForCausalLM

base_dir, peft_dir, merged_dir = sys.argv[1:4]
torch.manual_seed(0)
base = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()
adapted = PeftModel.from_pretrained(base, peft_dir).eval()
merged = LlamaForCausalLM.from_pretrained(merged_dir, torch_dtype=torch.float32).eval()
ids = torch.randint(0, base.config.vocab_size, (2, 24))
with torch.no_grad():
    a = adapted(input_ids=ids).logits
    m = merged(input_ids=ids).logits
    plain = LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32).eval()(input_ids=ids).logits
result = {
    "max_abs_diff_peft_vs_merged": float((a - m).abs().max()),
    "max_abs_logit": float(m.abs().max()),
    "max_abs_diff_base_vs_merged": float((plain - m).abs().max()),
}
print(json.dumps(result))
# The adapters must matter (the base alone differs) and PEFT must reproduce the merge.
ok = result["max_abs_diff_peft_vs_merged"] < 1e-4 * max(1.0, result["max_abs_logit"]) and \
    result["max_abs_diff_base_vs_merged"] > 100 * result["max_abs_diff_peft_vs_merged"]
sys.exit(0 if ok else 1)
