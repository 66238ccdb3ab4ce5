#!/usr/bin/env python3
"""Makes the packed-documents fixture under tests/fixtures/packing/ with transformers.

A tiny random LlamaForCausalLM (hidden 64, 2 layers, 4 query heads over 2 kv heads of
head_dim 16, intermediate 64, vocab 96, rope_theta 500, untied head), saved in float32 with
save_pretrained, and one packed batch of 2 rows of 48 tokens, each holding several documents
back to back (a 1-token and a 2-token document among them, and in row 0 a trailing pad region
of its own), run in transformers as TRL's padding-free packing runs it:
  - position_ids restart at 0 at each document's first token, and attention_mask is None, so
    that transformers 5 builds a block-causal mask from the position_ids
    (masking_utils.find_packed_sequence_indices; only without a cache, hence use_cache=False);
  - labels are the input ids with -100 at each document's first token and on the padding
    (transformers shifts them: the logits of token t are scored against labels[t + 1]).

In frugal's terms (tests/unit/test_packed_documents.cpp) the same batch is: tokens the input ids,
targets[t] = labels[t + 1] with -100 read as -1 (masked) and the last token of each row -1, so
the target of a document's last token is masked; positions[t] = t - start of t's document;
documents (ops::DocumentBounds) the [start, end) of t's document in its row, the pad region
being a document of its own.

Written next to the model (config.json, generation_config.json, model.safetensors):
  batch.json         {"rows", "seq", "documents": [[length, ...] per row, in order, the pad
                     region included], "pad_documents": [[index of each pad document] per row],
                     "pad_token_id", "input_ids", "position_ids", "labels" (the transformers
                     inputs, [rows][seq])}
  expected.json      {"loss_sum": the sum of the token losses of the packed batch (cross-entropy
                     of transformers' logits against its shifted labels; transformers' own mean
                     loss times "count" agrees within 1e-6), "loss_mean", "count": targets
                     counted, "document_loss_sums": [[sum of each document's token losses, the
                     document run alone in transformers (0 for one without targets)] per row],
                     "grads_file": "grads.safetensors", "transformers", "torch": versions}
  grads.safetensors  d(loss_sum)/d(parameter) of every parameter of the packed batch, float32,
                     named as the model's parameters

The script checks, and stops if any fails:
  - the packed batch equals the sum of its documents run alone (each a batch of one, positions
    0..n-1): the loss and every gradient within 1e-5 relative in float32, and within 1e-6 with
    the model in float64 (not closer: transformers keeps the eager softmax and the rotary
    angles in float32); that is, transformers really masks across documents from the
    position_ids;
  - eager and sdpa attention agree on the packed batch (float32, 1e-5);
  - the batch without packing (positions 0..seq-1, or position_ids restarting under an explicit
    all-ones attention_mask, both attending across documents) gives a loss more than 1e-3
    relative away (100 times the tests' tolerance), so a frugal run that ignored the documents
    would fail against the fixture.
Errors of gradients are max |a - b| over a tensor divided by max |b| of that tensor.

Run (not in CI: CI has no torch):
  /work/venv/bin/python tools/make_packing_fixtures.py [--out tests/fixtures/packing]
"""

import argparse
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from make_hf_fixtures import randomize, write_json_lines

SEQ = 48
PAD_TOKEN_ID = 0
# Document lengths per row, in order; "pad" marks the pad region (its own document, no targets).
ROWS = [
    [13, 1, 2, 20, 7, ("pad", 5)],
    [1, 24, 2, 18, 3],
]


def layout(vocab, seed):
    """The transformers inputs of the packed batch and the document structure."""
    gen = torch.Generator().manual_seed(seed)
    input_ids, position_ids, labels, documents, pads = [], [], [], [], []
    for row in ROWS:
        ids, pos, lab, lengths, pad_docs = [], [], [], [], []
        for d, doc in enumerate(row):
            is_pad = isinstance(doc, tuple)
            n = doc[1] if is_pad else doc
            tokens = ([PAD_TOKEN_ID] * n if is_pad else
                      torch.randint(1, vocab, (n,), generator=gen).tolist())
            ids += tokens
            pos += list(range(n))
            lab += [-100] * n if is_pad else [-100] + tokens[1:]
            lengths.append(n)
            if is_pad:
                pad_docs.append(d)
        assert len(ids) == SEQ, f"a row of {len(ids)} tokens, not {SEQ}"
        input_ids.append(ids)
        position_ids.append(pos)
        labels.append(lab)
        documents.append(lengths)
        pads.append(pad_docs)
    return input_ids, position_ids, labels, documents, pads


def grads_of(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def packed_loss_and_grads(model, input_ids, position_ids, labels, attention_mask=None):
    """Sum of the token losses and its gradients. The sum is taken from the logits in their
    own dtype (transformers' loss casts them to float32, which would spoil the float64 check),
    and checked against transformers' own mean loss times the count, so that its shift and
    -100 handling are the ones used."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, position_ids=position_ids, labels=labels,
                attention_mask=attention_mask, use_cache=False)
    count = int((labels[:, 1:] != -100).sum())
    logits = out.logits
    loss_sum = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
        ignore_index=-100, reduction="sum")
    hf_sum = float(out.loss.detach()) * count
    assert abs(hf_sum - float(loss_sum.detach())) <= 1e-6 * abs(hf_sum), (hf_sum, loss_sum)
    loss_sum.backward()
    return float(loss_sum.detach()), count, grads_of(model)


def documents_alone(model, input_ids, documents, pads):
    """Each document run alone (batch of one, positions 0..n-1, no mask): the sums of its
    token losses, and the gradients of all of them summed."""
    model.zero_grad(set_to_none=True)
    sums = []
    for r, lengths in enumerate(documents):
        row_sums, start = [], 0
        for d, n in enumerate(lengths):
            if d in pads[r] or n < 2:  # no targets: no loss, no gradient
                row_sums.append(0.0)
            else:
                ids = input_ids[r:r + 1, start:start + n]
                logits = model(input_ids=ids, use_cache=False).logits
                loss_sum = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:],
                                                             reduction="sum")
                loss_sum.backward()
                row_sums.append(float(loss_sum.detach()))
            start += n
        sums.append(row_sums)
    grads = {name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for name, p in model.named_parameters()}
    return sums, grads


def grad_error(a, b):
    """The largest over tensors of max |a - b| / max |b|, and the tensor where it is."""
    worst, where = 0.0, None
    for name in b:
        err = float((a[name] - b[name]).abs().max() / b[name].abs().max())
        if err > worst:
            worst, where = err, name
    return worst, where


def rel(a, b):
    return abs(a - b) / abs(b)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "packing"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic reductions
    seed = 71

    config = LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                         max_position_embeddings=64, rope_theta=500.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=PAD_TOKEN_ID, attn_implementation="eager")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()  # eval: no dropout (there is none in Llama anyway)
    randomize(model, seed, std=0.15)

    ids_list, pos_list, lab_list, documents, pads = layout(config.vocab_size, seed + 1)
    input_ids = torch.tensor(ids_list)
    position_ids = torch.tensor(pos_list)
    labels = torch.tensor(lab_list)

    loss_sum, count, grads = packed_loss_and_grads(model, input_ids, position_ids, labels)
    doc_sums, doc_grads = documents_alone(model, input_ids, documents, pads)
    alone = sum(sum(row) for row in doc_sums)
    g_err, g_where = grad_error(grads, doc_grads)
    print(f"float32: packed loss sum {loss_sum:.7f} over {count} targets; documents alone "
          f"{alone:.7f} (rel {rel(alone, loss_sum):.2e}); gradients max rel {g_err:.2e} "
          f"({g_where})")
    assert rel(alone, loss_sum) < 1e-5 and g_err < 1e-5

    # float64 (but for the softmax and the rotary angles, which transformers keeps in float32).
    model64 = LlamaForCausalLM(config).eval().double()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    loss64, _, grads64 = packed_loss_and_grads(model64, input_ids, position_ids, labels)
    doc_sums64, doc_grads64 = documents_alone(model64, input_ids, documents, pads)
    alone64 = sum(sum(row) for row in doc_sums64)
    g_err64, _ = grad_error(grads64, doc_grads64)
    fp32_vs_64, _ = grad_error(grads, grads64)
    print(f"float64: packed {loss64:.12f}, documents alone {alone64:.12f} (rel "
          f"{rel(alone64, loss64):.2e}); gradients max rel {g_err64:.2e}; float32 against "
          f"float64: loss rel {rel(loss_sum, loss64):.2e}, gradients {fp32_vs_64:.2e}")
    assert rel(alone64, loss64) < 1e-6 and g_err64 < 1e-6

    # sdpa against eager.
    model.config._attn_implementation = "sdpa"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "sdpa"
    loss_sdpa, _, grads_sdpa = packed_loss_and_grads(model, input_ids, position_ids, labels)
    s_err, _ = grad_error(grads_sdpa, grads)
    print(f"sdpa: loss rel {rel(loss_sdpa, loss_sum):.2e}, gradients {s_err:.2e}")
    assert rel(loss_sdpa, loss_sum) < 1e-5 and s_err < 1e-5
    model.config._attn_implementation = "eager"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "eager"

    # Without packing the loss is clearly different: the fixture can tell.
    plain = torch.arange(SEQ).expand(len(ROWS), SEQ)
    loss_plain, _, grads_plain = packed_loss_and_grads(model, input_ids, plain, labels)
    loss_cross, _, grads_cross = packed_loss_and_grads(
        model, input_ids, position_ids, labels, attention_mask=torch.ones_like(input_ids))
    print(f"unpacked: positions 0..{SEQ - 1} loss rel {rel(loss_plain, loss_sum):.2e}, "
          f"gradients {grad_error(grads_plain, grads)[0]:.2e}; restarting positions but "
          f"attending across documents loss rel {rel(loss_cross, loss_sum):.2e}, gradients "
          f"{grad_error(grads_cross, grads)[0]:.2e}")
    assert min(rel(loss_plain, loss_sum), rel(loss_cross, loss_sum)) > 1e-3

    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    model.save_pretrained(args.out)
    save_file({k: v.contiguous() for k, v in grads.items()},
              os.path.join(args.out, "grads.safetensors"), metadata={"format": "pt"})
    write_json_lines(os.path.join(args.out, "batch.json"), {
        "rows": len(ROWS), "seq": SEQ, "documents": documents, "pad_documents": pads,
        "pad_token_id": PAD_TOKEN_ID, "input_ids": ids_list, "position_ids": pos_list,
        "labels": lab_list})
    write_json_lines(os.path.join(args.out, "expected.json"), {
        "loss_sum": loss_sum, "loss_mean": loss_sum / count, "count": count,
        "document_loss_sums": doc_sums, "grads_file": "grads.safetensors",
        "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]})
    print(f"wrote {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
