#!/usr/bin/env python3
"""doc/fine-tuning.md's last step, as a check: the base model (transformers) with a run's PEFT
adapter (`frugal export --peft`) answers a chat rendered by apply_chat_template, greedy; the
reply is printed with its ids. With --frugal-ids "IDS" (the output of `frugal generate --chat
--ids` on the same run, prompt and reply) the reply's ids must be the same: for a `lora` run
(full-precision base) PEFT computes what frugal does; for `qlora` frugal's base is the NF4 one,
so only the prompt's ids are compared. Not part of CI (needs torch, transformers and peft).
usage: check_chat_peft.py MODEL_DIR PEFT_DIR [--system TEXT] --prompt TEXT
                          [--max-new-tokens N] [--frugal-ids "IDS"] [--quantized-base]"""
import argparse
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("peft")
p.add_argument("--system", default="")
p.add_argument("--prompt", required=True)
p.add_argument("--max-new-tokens", type=int, default=32)
p.add_argument("--frugal-ids", default="")
p.add_argument("--quantized-base", action="store_true",
               help="the run's base was 4-bit (qlora): compare the prompt only")
a = p.parse_args()

tokenizer = AutoTokenizer.from_pretrained(a.model)
base = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
model = PeftModel.from_pretrained(base, a.peft).eval()
messages = ([{"role": "system", "content": a.system}] if a.system else []) + \
    [{"role": "user", "content": a.prompt}]
ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True)
eos = GenerationConfig.from_pretrained(a.model).eos_token_id
with torch.no_grad():
    out = model.generate(**ids, max_new_tokens=a.max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos if isinstance(eos, int) else eos[0])
prompt = ids["input_ids"][0].tolist()
reply = out[0, len(prompt):].tolist()
result = {"prompt_ids": len(prompt), "reply_ids": reply,
          "reply": tokenizer.decode(reply, skip_special_tokens=True)}
ok = True
if a.frugal_ids:
    frugal = [int(t) for t in a.frugal_ids.split()]
    result["prompt_equal"] = frugal[:len(prompt)] == prompt
    ok = result["prompt_equal"]
    if not a.quantized_base:
        result["reply_equal"] = frugal[len(prompt):] == reply
        ok = ok and result["reply_equal"]
print(json.dumps(result))
sys.exit(0 if ok else 1)
