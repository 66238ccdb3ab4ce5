#!/usr/bin/env python3
"""The peer of tools/bench/sft_vs_trl: TRL's SFTTrainer fine-tuning on conversations with
completion-only loss, QLoRA (transformers + PEFT + bitsandbytes NF4 with double quantization),
and what the bench needs around it. Not part of CI (needs torch, transformers, trl, peft,
bitsandbytes, datasets).

  trl_sft.py model --out DIR --tokenizer DIR [shape]     a random Llama, bf16, with the tokenizer
  trl_sft.py data --out DIR --conversations N --seed S    chats.jsonl (frugal's "messages") and
                                                          trl.jsonl (TRL's conversational
                                                          prompt/completion: the last assistant
                                                          turn is the completion), and their
                                                          first --first records apart
  trl_sft.py train --model DIR --data FILE [settings]     SFTTrainer; prints one JSON line: the
                                                          first step's loss, tokens/s (every
                                                          token of the batches but padding, and
                                                          the trained ones), peak memory;
                                                          --packing: TRL's padding-free packing
With --batch equal to the number of records and --steps 1 the first step's loss is the
completion-only loss of the initial model (LoRA's B starts at zero) on every record at once:
what `frugal eval --data FILE --train-on last_turn --quant nf4` computes on the same records."""
import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or have an "
         "they which one you were her all she there would their we him been has when who will "
         "more no if out so said what up its about into than them can only other new some time "
         "could these two may then do first any my now such like our over man me even most made "
         "after also did many before must through back years where much your way well down "
         "should because each just those people how too little state good very make world still "
         "own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used "
         "take three river mountain city code memory kernel cache compiler network question "
         "answer reason number paris france ocean water light").split()


def sentence(rng, lo, hi):
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + rng.choice([".", ".", "?", "!"])


def make_model(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                         max_position_embeddings=a.max_positions, rope_theta=10000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=None)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out = Path(a.out)
    model.save_pretrained(out)
    for f in Path(a.tokenizer).iterdir():
        if f.name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                      "chat_template.jinja", "generation_config.json"):
            shutil.copy(f, out / f.name)


def make_data(a):
    rng = random.Random(a.seed)
    out = Path(a.out)
    chats, trl = [], []
    for _ in range(a.conversations):
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": sentence(rng, 6, 20)})
        for _ in range(rng.randint(a.min_turns, a.max_turns)):
            messages.append({"role": "user", "content": " ".join(
                sentence(rng, 5, 30) for _ in range(rng.randint(1, 6)))})
            messages.append({"role": "assistant", "content": " ".join(
                sentence(rng, 5, 30) for _ in range(rng.randint(2, 16)))})
        chats.append({"messages": messages})
        trl.append({"prompt": messages[:-1], "completion": messages[-1:]})
    for name, records in (("chats", chats), ("trl", trl)):
        with open(out / f"{name}.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        with open(out / f"first_{name}.jsonl", "w") as f:
            for r in records[:a.first]:
                f.write(json.dumps(r) + "\n")


def train(a):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import SFTConfig, SFTTrainer

    records = [json.loads(line) for line in open(a.data)]
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    quant = None
    if not a.no_quant:
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
    dtype = torch.float32 if a.no_quant else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(a.model, quantization_config=quant, dtype=dtype,
                                                 attn_implementation="sdpa")
    lora = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    config = SFTConfig(output_dir=a.out, max_steps=a.steps + a.warmup,
                       per_device_train_batch_size=a.batch, gradient_accumulation_steps=1,
                       learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0,
                       weight_decay=0.0, optim="adamw_torch", logging_steps=1,
                       save_strategy="no", report_to="none", bf16=not a.no_quant,
                       gradient_checkpointing=not a.no_quant, max_length=a.max_length,
                       packing=a.packing, padding_free=a.packing, packing_strategy="bfd",
                       completion_only_loss=True, dataset_num_proc=1,
                       dataloader_num_workers=0, seed=0, remove_unused_columns=True)

    counts = {"tokens": 0, "trained": 0}
    timing = {"start": None}

    class CountingTrainer(SFTTrainer):
        # The tokens a step processes (every token of its batch but padding) and the ones its
        # loss counts, from the batch itself; the clock starts after the warm-up steps.
        def compute_loss(self, model, inputs, *args, **kwargs):
            step = self.state.global_step
            if step == a.warmup and timing["start"] is None:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timing["start"] = time.perf_counter()
            if step >= a.warmup:
                # Padding-free batches have no padding, and no attention mask: every id counts.
                mask = inputs.get("attention_mask")
                counts["tokens"] += int(mask.sum()) if mask is not None else \
                    int(inputs["input_ids"].numel())
                counts["trained"] += int((inputs["labels"][:, 1:] != -100).sum())
            return super().compute_loss(model, inputs, *args, **kwargs)

    trainer = CountingTrainer(model=model, args=config, train_dataset=Dataset.from_list(records),
                              processing_class=tokenizer, peft_config=lora)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - timing["start"] if timing["start"] is not None else None
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result = {"first_step_loss": losses[0] if losses else None,
              "steps_timed": a.steps, "seconds": seconds,
              "tokens": counts["tokens"], "trained_tokens": counts["trained"],
              "tokens_per_s": counts["tokens"] / seconds if seconds else None,
              "trained_tokens_per_s": counts["trained"] / seconds if seconds else None,
              "max_memory_reserved_bytes": torch.cuda.max_memory_reserved()
              if torch.cuda.is_available() else None,
              "torch": torch.__version__}
    import transformers
    import trl
    result["transformers"] = transformers.__version__
    result["trl"] = trl.__version__
    print(json.dumps(result))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("model")
    m.add_argument("--out", required=True)
    m.add_argument("--tokenizer", required=True)
    for key, value in (("hidden", 2048), ("intermediate", 5632), ("layers", 22), ("heads", 32),
                       ("kv_heads", 4), ("vocab", 32000), ("max_positions", 4096)):
        m.add_argument("--" + key, type=int, default=value)
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("--conversations", type=int, default=512)
    d.add_argument("--first", type=int, default=16)
    d.add_argument("--min-turns", type=int, default=1)
    d.add_argument("--max-turns", type=int, default=4)
    d.add_argument("--seed", type=int, default=1)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--out", default="/tmp/trl_sft_out")
    t.add_argument("--batch", type=int, default=2)
    t.add_argument("--max-length", type=int, default=2048)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--warmup", type=int, default=3)
    t.add_argument("--rank", type=int, default=16)
    t.add_argument("--alpha", type=int, default=32)
    t.add_argument("--no-quant", action="store_true", help="fp32 LoRA, no bitsandbytes (CPU)")
    t.add_argument("--packing", action="store_true",
                   help="padding-free packing (best-fit decreasing into --max-length rows, "
                        "position ids restarting per conversation)")
    a = p.parse_args()
    {"model": make_model, "data": make_data, "train": train}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
