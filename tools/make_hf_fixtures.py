#!/usr/bin/env python3
"""Makes the Hugging Face parity fixtures under tests/fixtures/hf/ with transformers.

Two tiny random LlamaForCausalLM models, saved with save_pretrained (float32 safetensors):
  gqa_untied/          4 query heads over 2 kv heads, untied lm_head, rope_theta 50000,
                       rms_norm_eps 1e-5 (neither is transformers' default), one file
  mha_tied_sharded/    3 heads = 3 kv heads, tied embeddings, saved in 2 shards with
                       model.safetensors.index.json
and one model per rotary scaling type, each with sequences longer than the context it scales
from (so that the scaled frequencies matter), saved by transformers 5 with its config's
rope_parameters:
  rope_linear/         linear (position interpolation), factor 2.5
  rope_dynamic/        dynamic NTK, factor 2, max_position_embeddings 16; lines in ascending
                       length (transformers' dynamic update keeps the longest length seen, and
                       frugal computes each sequence alone: ascending order makes them agree),
                       and the greedy continuation runs past 16 tokens
  rope_yarn/           YaRN, factor 4 from 32 to 128 tokens, attention factor 0.1 ln 4 + 1
  rope_llama3/         Llama 3's scaling, factor 4, original 32, low/high 1/4, rope_theta 100
                       (so the pairs fall in all three bands: kept, blended, interpolated)
and a Qwen2ForCausalLM (q/k/v projections with biases, randomised like the weights):
  qwen2_gqa/           4 heads over 2 kv heads, untied head, rope_theta 1e6, eps 1e-6
and a MistralForCausalLM with a sliding window shorter than its sequences (token i attends to
tokens i - 5 < j <= i), whose greedy continuation runs past the window:
  mistral_window/      4 heads over 2 kv heads, sliding_window 5, sequences of 16, 11 and 7
and dtypes.safetensors: small tensors in F64/F32/F16/BF16 written by the safetensors library,
with their values in dtypes.json, to check frugal's conversions against an independent
writer.

Next to each model:
  tokens.txt     whitespace-separated token ids, one sequence per line
  expected.json  {"loss": mean next-token cross-entropy over all predicted positions of all
                 lines (transformers' own loss, per line times its predicted positions, summed
                 and divided by the count), "tokens": that count, "line_losses": [...],
                 "logits_file": "logits.f32", "logits_shape": [rows, vocab] (every position
                 of every line, lines concatenated, raw little-endian float32),
                 "prompt": [...], "greedy": prompt + 12 greedy tokens from model.generate,
                 "greedy_min_margin": the smallest top-1 minus top-2 logit along the way}

The weights are drawn larger than transformers' default init (std 0.02 gives near-uniform
logits whose argmax a rounding difference could flip), and the norm weights are randomised so
that a norm applied wrongly shows. The script checks the greedy margins are far above fp32
noise.

Run (not in CI: CI has no torch):
  python3 -m venv /work/venv && /work/venv/bin/pip install torch transformers safetensors numpy
  /work/venv/bin/python tools/make_hf_fixtures.py [--out tests/fixtures/hf] [--only NAME ...]
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

GREEDY_NEW_TOKENS = 12


def randomize(model, seed, std):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def write_json_lines(path, obj):
    """JSON with one key per line and each value on that line, so that shell tests can grep
    a key without a JSON parser."""
    with open(path, "w") as f:
        f.write("{\n")
        f.write(",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()))
        f.write("\n}\n")


def token_lines(vocab, lengths, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


ONLY = None  # --only: the names to make (None: all)


def make_model(out_dir, name, config, seed, std, lengths, prompt_len, max_shard_size=None,
               model_class=LlamaForCausalLM):
    if ONLY is not None and name not in ONLY:
        return
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomize(model, seed, std)
    path = os.path.join(out_dir, name)
    shutil.rmtree(path, ignore_errors=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kwargs)

    lines = token_lines(config.vocab_size, lengths, seed + 1)
    with open(os.path.join(path, "tokens.txt"), "w") as f:
        for line in lines:
            f.write(" ".join(str(t) for t in line) + "\n")

    loss_sum, count, line_losses, logits_rows = 0.0, 0, [], []
    with torch.no_grad():
        for line in lines:
            ids = torch.tensor([line])
            out = model(ids, labels=ids)
            n = len(line) - 1
            line_losses.append(float(out.loss))
            loss_sum += float(out.loss) * n
            count += n
            logits_rows.append(out.logits[0].float().numpy())
    logits = np.concatenate(logits_rows).astype("<f4")
    logits.tofile(os.path.join(path, "logits.f32"))

    prompt = lines[0][:prompt_len]
    with torch.no_grad():
        greedy = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_NEW_TOKENS,
                                do_sample=False, pad_token_id=config.eos_token_id,
                                output_logits=True, return_dict_in_generate=True)
    margins = []
    for step_logits in greedy.logits:
        top = torch.topk(step_logits[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    min_margin = min(margins)
    assert min_margin > 1e-3, f"{name}: greedy margin {min_margin} too small; change the seed"

    expected = {
        "loss": loss_sum / count,
        "tokens": count,
        "line_losses": line_losses,
        "logits_file": "logits.f32",
        "logits_shape": list(logits.shape),
        "prompt": prompt,
        "greedy": greedy.sequences[0].tolist(),
        "greedy_min_margin": min_margin,
    }
    write_json_lines(os.path.join(path, "expected.json"), expected)
    print(f"{name}: loss {expected['loss']:.6f} over {count} tokens, greedy {expected['greedy']}"
          f" (min margin {min_margin:.3g})")


def make_dtypes(out_dir):
    values = np.array([0.0, 1.0, -2.5, 3.140625, 1e-3, -65504.0, 1.0e-7, 448.0, 1.5e5,
                       -0.0, 7.0, 0.099853515625], dtype=np.float64)
    tensors = {
        "f64": torch.tensor(values, dtype=torch.float64).reshape(3, 4),
        "f32": torch.tensor(values, dtype=torch.float32).reshape(4, 3),
        "f16": torch.tensor(values[:6], dtype=torch.float16).reshape(2, 3),
        "bf16": torch.tensor(values, dtype=torch.bfloat16).reshape(2, 2, 3),
        "i64": torch.arange(5, dtype=torch.int64),
    }
    save_file(tensors, os.path.join(out_dir, "dtypes.safetensors"), metadata={"format": "pt"})
    expected = {name: {"shape": list(t.shape), "values": t.double().flatten().tolist()}
                for name, t in tensors.items() if t.is_floating_point()}
    write_json_lines(os.path.join(out_dir, "dtypes.json"), expected)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "hf"))
    parser.add_argument("--only", nargs="+", help="make only these fixtures (dtypes: the dtype file)")
    args = parser.parse_args()
    global ONLY
    ONLY = set(args.only) if args.only else None
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)  # deterministic reductions

    gqa = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=112,
                      max_position_embeddings=64, rope_theta=50000.0, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      attn_implementation="eager")
    make_model(args.out, "gqa_untied", gqa, seed=11, std=0.15, lengths=[17, 11, 5],
               prompt_len=5)

    tied = LlamaConfig(hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=3, num_key_value_heads=3, vocab_size=100,
                       max_position_embeddings=48, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, attn_implementation="eager")
    make_model(args.out, "mha_tied_sharded", tied, seed=23, std=0.15, lengths=[13, 20, 2],
               prompt_len=4, max_shard_size="100KB")

    def rope_model(name, seed, max_pos, rope, lengths, prompt_len, theta=10000.0):
        config = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                             max_position_embeddings=max_pos, rope_theta=theta,
                             rope_scaling=dict(rope, rope_theta=theta), rms_norm_eps=1e-5,
                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                             attn_implementation="eager")
        make_model(args.out, name, config, seed=seed, std=0.2, lengths=lengths,
                   prompt_len=prompt_len)

    rope_model("rope_linear", 31, 64, {"rope_type": "linear", "factor": 2.5}, [40, 23, 7], 20)
    rope_model("rope_dynamic", 38, 16, {"rope_type": "dynamic", "factor": 2.0}, [9, 21, 30], 12)
    rope_model("rope_yarn", 41, 128,
               {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
               [70, 45, 9], 30)
    rope_model("rope_llama3", 43, 128,
               {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 32,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}, [70, 45, 9], 30, theta=100.0)

    qwen2 = Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                        max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6,
                        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                        use_sliding_window=False, attn_implementation="eager")
    make_model(args.out, "qwen2_gqa", qwen2, seed=53, std=0.15, lengths=[19, 12, 6],
               prompt_len=5, model_class=Qwen2ForCausalLM)

    # transformers' eager Mistral masks with sliding_window_overlay: kv_idx > q_idx - 5.
    mistral = MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=80,
                            max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                            sliding_window=5, tie_word_embeddings=False, bos_token_id=1,
                            eos_token_id=2, attn_implementation="eager")
    make_model(args.out, "mistral_window", mistral, seed=61, std=0.15, lengths=[16, 11, 7],
               prompt_len=6, model_class=MistralForCausalLM)

    if ONLY is None or "dtypes" in ONLY:
        make_dtypes(args.out)


if __name__ == "__main__":
    main()
