#!/usr/bin/env python3
"""PyTorch FlexAttention with the block-causal document mask on the cases frugal's bench_attention
measured with --documents, against frugal's times.

For every JSON line of --frugal that has documents, this builds the same mask in FlexAttention,
as torchtitan does for packed documents: a document id per position (from the line's
doc_lengths), a mask_mod `causal and same document`, one BlockMask from create_block_mask
(128 x 128 blocks, made once per case, outside the timing), and flex_attention under
torch.compile (--mode; torchtitan's is max-autotune-no-cudagraphs, static shapes). Inputs are
bf16 in frugal's layout ([B, S, H, D], seen as [B, H, S, D] as a model's transposed projections
are), GQA through enable_gqa. It times the forward (with inputs that need gradients, as in
training) and forward + backward, median of --iters runs after warm-up (the compile and
autotune happen there), and prints one JSON line per case with both times, TFLOP/s and the
ratios: speedup of frugal over Flex (Flex ms / frugal ms) and of frugal's documents over
frugal's full-causal run of the same shape (the line of --frugal without documents). A summary
table of them closes the output.
TFLOP/s, for both frugal and Flex, count the visible pairs only: L^2 / 2 per document of L
tokens (forward 4 H D per pair, backward 2.5 times that, as bench_attention counts causal
attention), so a kernel that skips masked tiles does not get credit for work it skipped.
Each line also says whether Flex's BlockMask keeps exactly as many 128 x 128 tiles as
bench_attention counted (mask_tiles_agree), a check that both built the same mask.

With --check DUMP (bench_attention --dump, with or without --documents; repeatable) it runs
FlexAttention on frugal's inputs widened to fp32 (eager flex_attention, FlexAttention's
reference path: dense fp32 scores under the same BlockMask; gradients only on the GPU, as
FlexAttention has no backward on the CPU) and prints the max relative error,
max |frugal - ref| / max |ref|, of frugal's out, dq, dk and dv; next to it, for scale, that of
bf16 SDPA given the same mask as a dense boolean matrix on the same bf16 inputs.
--self-test checks this script's mask on small awkward cases: FlexAttention (fp32, eager)
against SDPA with a dense mask built another way (from each position's document start), and
the BlockMask's tiles against the dense mask's; it runs on the CPU too (--device cpu).

usage: torch_flex_attention.py [--frugal FRUGAL.jsonl] [--check DUMP]... [--iters N]
                               [--mode MODE] [--self-test] [--device cuda|cpu]
"""
import argparse
import json
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# The same timing as the SDPA bench (its warm-up calls also take Flex's compile and autotune).
from torch_sdpa import median_ms

TILE = 128  # BlockMask's block and bench_attention's tile count: 128 query rows x 128 keys


def validate_lengths(lengths, batch, seq):
    if len(lengths) != batch or any(sum(x) != seq or min(x) < 1 for x in lengths):
        raise SystemExit(f"torch_flex_attention: document lengths {lengths} do not fill "
                         f"{batch} sequences of {seq} tokens")


def document_ids(lengths, device):
    """[B, S] int32: which document of its sequence each position is in."""
    rows = [torch.repeat_interleave(torch.arange(len(x), dtype=torch.int32), torch.tensor(x))
            for x in lengths]
    return torch.stack(rows).to(device)


def block_causal_mask(lengths, seq, device):
    """The BlockMask of `causal and same document` for sequences packed as `lengths`."""
    ids = document_ids(lengths, device)

    def causal_same_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (ids[b, q_idx] == ids[b, kv_idx])

    return create_block_mask(causal_same_document, B=len(lengths), H=None, Q_LEN=seq, KV_LEN=seq,
                             device=device, BLOCK_SIZE=TILE)


def dense_mask(lengths, seq, device):
    """[B, 1, S, S] bool, built apart from the document ids: key k is visible to query q iff
    start(q) <= k <= q, start(q) being where q's document begins."""
    masks = []
    for x in lengths:
        starts = torch.cat([torch.zeros(1, dtype=torch.long),
                            torch.cumsum(torch.tensor(x), 0)[:-1]])
        start_of = torch.repeat_interleave(starts, torch.tensor(x))  # [S]
        q = torch.arange(seq)[:, None]
        k = torch.arange(seq)[None, :]
        masks.append((k <= q) & (k >= start_of[:, None]))
    return torch.stack(masks)[:, None].to(device)


def block_mask_tiles(block_mask):
    """Tiles the BlockMask computes (partly and fully visible ones), over the whole batch."""
    tiles = block_mask.kv_num_blocks.sum()
    if block_mask.full_kv_num_blocks is not None:
        tiles = tiles + block_mask.full_kv_num_blocks.sum()
    return int(tiles)


def dense_mask_tiles(mask):
    """Tiles of `mask` [B, 1, S, S] holding a visible pair."""
    b, _, s, _ = mask.shape
    n = -(-s // TILE)
    padded = torch.zeros(b, n * TILE, n * TILE, dtype=torch.bool, device=mask.device)
    padded[:, :s, :s] = mask[:, 0]
    return int(padded.view(b, n, TILE, n, TILE).any(dim=4).any(dim=2).sum())


def causal_tiles(batch, seq):
    n = -(-seq // TILE)
    return batch * n * (n + 1) // 2


def visible_pairs(lengths):
    """Pairs counted as work, summed over the batch: L^2 / 2 per document (S^2 / 2 for one)."""
    return sum(length * length / 2 for x in lengths for length in x)


def attend(fn, q, k, v, block_mask):
    """fn (flex_attention, compiled or not) on [B, S, H, D] tensors -> [B, S, H, D]."""
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask,
             enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def time_flex(flex, fr, iters):
    b, h, kvh, s, d = (fr[x] for x in ("batch", "heads", "kv_heads", "seq", "head_dim"))
    block_mask = block_causal_mask(fr["doc_lengths"], s, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, amplitude=1.0):  # bench_attention's ranges
        x = torch.rand(*shape, device="cuda", generator=gen) * 2 - 1
        return (x * amplitude).to(torch.bfloat16)

    q = rand(b, s, h, d, amplitude=2.0).requires_grad_()
    k = rand(b, s, kvh, d, amplitude=2.0).requires_grad_()
    v = rand(b, s, kvh, d).requires_grad_()
    dout = rand(b, s, h, d)

    def forward():
        attend(flex, q, k, v, block_mask)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        attend(flex, q, k, v, block_mask).backward(dout)

    fwd_ms, fwdbwd_ms = median_ms(forward, iters), median_ms(forward_backward, iters)
    return fwd_ms, fwdbwd_ms, block_mask_tiles(block_mask)


def same_shape(a, b):
    """Same shape and requested kernel; the gradients' dtype may differ (grads "auto" resolves
    per call, so both lines' are printed)."""
    keys = ("batch", "heads", "kv_heads", "seq", "head_dim", "kernel")
    return all(a.get(x) == b.get(x) for x in keys)


def compare(frugal_lines, flex, iters):
    causal = [x for x in frugal_lines if x.get("documents", "none") == "none"]
    results = []
    for fr in frugal_lines:
        if fr.get("documents", "none") == "none":
            continue
        b, h, kvh, s, d = (fr[x] for x in ("batch", "heads", "kv_heads", "seq", "head_dim"))
        validate_lengths(fr["doc_lengths"], b, s)
        flex_fwd_ms, flex_fwdbwd_ms, flex_tiles = time_flex(flex, fr, iters)
        fwd_flop = 4.0 * h * d * visible_pairs(fr["doc_lengths"])
        tflops = lambda flop, ms: round(flop / ms * 1e-9, 1)
        full = next((x for x in causal if same_shape(x, fr)), None)
        line = {
            "batch": b, "heads": h, "kv_heads": kvh, "seq": s, "head_dim": d,
            "documents": fr["documents"], "kernel": fr.get("kernel"), "grads": fr.get("grads"),
            "doc_count": fr["doc_count"], "doc_len_median": fr["doc_len_median"],
            "doc_len_mean": fr["doc_len_mean"], "doc_len_max": fr["doc_len_max"],
            "pairs_share_of_causal": fr["pairs_share_of_causal"],
            "tiles_skipped_vs_causal": fr["tiles_skipped_vs_causal"],
            "mask_tiles_agree": flex_tiles == fr["tiles_visible"],
            "frugal_fwd_ms": fr["fwd_ms"], "flex_fwd_ms": round(flex_fwd_ms, 4),
            "frugal_fwdbwd_ms": fr["fwdbwd_ms"], "flex_fwdbwd_ms": round(flex_fwdbwd_ms, 4),
            "frugal_fwd_tflops": tflops(fwd_flop, fr["fwd_ms"]),
            "flex_fwd_tflops": tflops(fwd_flop, flex_fwd_ms),
            "frugal_fwdbwd_tflops": tflops(3.5 * fwd_flop, fr["fwdbwd_ms"]),
            "flex_fwdbwd_tflops": tflops(3.5 * fwd_flop, flex_fwdbwd_ms),
            "fwd_speedup_vs_flex": round(flex_fwd_ms / fr["fwd_ms"], 3),
            "fwdbwd_speedup_vs_flex": round(flex_fwdbwd_ms / fr["fwdbwd_ms"], 3),
            "causal_grads": full.get("grads") if full else None,
            "causal_fwd_ms": full["fwd_ms"] if full else None,
            "causal_fwdbwd_ms": full["fwdbwd_ms"] if full else None,
            "fwd_speedup_vs_causal": round(full["fwd_ms"] / fr["fwd_ms"], 3) if full else None,
            "fwdbwd_speedup_vs_causal":
                round(full["fwdbwd_ms"] / fr["fwdbwd_ms"], 3) if full else None,
        }
        print(json.dumps(line), flush=True)
        results.append(line)
        torch.cuda.empty_cache()
    return results


def summary_table(results):
    if not results:
        return
    print("\nfwd+bwd, ms (speedups: > 1 means frugal's documents are faster)")
    header = (f"{'B':>2} {'S':>6} {'H:KVH':>6} {'D':>4} {'documents':<10} {'docs':>5} "
              f"{'skip':>5} {'frugal':>8} {'flex':>8} {'causal':>8} {'x flex':>7} "
              f"{'x causal':>8} {'fwd x flex':>10} {'fwd x causal':>12}")
    print(header)
    for r in results:
        fmt = lambda x, spec: "-" if x is None else format(x, spec)
        print(f"{r['batch']:>2} {r['seq']:>6} {str(r['heads']) + ':' + str(r['kv_heads']):>6} "
              f"{r['head_dim']:>4} {r['documents']:<10} {r['doc_count']:>5} "
              f"{r['tiles_skipped_vs_causal']:>5.2f} {r['frugal_fwdbwd_ms']:>8.3f} "
              f"{r['flex_fwdbwd_ms']:>8.3f} {fmt(r['causal_fwdbwd_ms'], '>8.3f')} "
              f"{r['fwdbwd_speedup_vs_flex']:>7.2f} {fmt(r['fwdbwd_speedup_vs_causal'], '>8.2f')} "
              f"{r['fwd_speedup_vs_flex']:>10.2f} {fmt(r['fwd_speedup_vs_causal'], '>12.2f')}")
    if not all(r["mask_tiles_agree"] for r in results):
        print("WARNING: Flex's BlockMask and bench_attention disagree on the visible tiles")


def read_dump(path, device):
    """bench_attention --dump: the tensors, and the document lengths (one document per sequence
    when the dump has none)."""
    with open(path, "rb") as f:
        b, h, kvh, s, d = (int(x) for x in np.fromfile(f, dtype=np.int64, count=5))

        def take(dtype, n):
            x = np.fromfile(f, dtype=dtype, count=n)
            if x.size != n:
                raise SystemExit(f"torch_flex_attention: {path} is shorter than its header says")
            return torch.from_numpy(x.copy())

        def bf16(*shape):
            return take(np.int16, int(np.prod(shape))).view(torch.bfloat16).reshape(*shape)

        def fp32(*shape):
            return take(np.float32, int(np.prod(shape))).reshape(*shape)

        q, k, v, dout, out = (bf16(b, s, n, d) for n in (h, kvh, kvh, h, h))
        fp32(b, h, s)  # lse
        dq, dk, dv = fp32(b, s, h, d), fp32(b, s, kvh, d), fp32(b, s, kvh, d)
        rest = np.fromfile(f, dtype=np.int64)
    if rest.size == 0:
        lengths = [[s] for _ in range(b)]
    else:
        lengths, at = [], 0
        for _ in range(b):
            if at >= rest.size or at + 1 + int(rest[at]) > rest.size:
                raise SystemExit(f"torch_flex_attention: {path}: truncated document lengths")
            count = int(rest[at])
            lengths.append([int(x) for x in rest[at + 1:at + 1 + count]])
            at += 1 + count
        if at != rest.size:
            raise SystemExit(f"torch_flex_attention: {path}: bytes after the document lengths")
    validate_lengths(lengths, b, s)
    tensors = [x.to(device) for x in (q, k, v, dout, out, dq, dk, dv)]
    return (b, h, kvh, s, d), lengths, tensors


def max_rel_err(got, want):
    if want is None:  # a gradient FlexAttention does not make on the CPU
        return None
    want = want.detach().float()
    return float((got.detach().float() - want).abs().max() / want.abs().max())


def reference(q, k, v, dout, lengths, seq):
    """Eager flex_attention in fp32 under the block-causal BlockMask: out, dq, dk, dv (FlexAttention
    has no backward on the CPU: there the gradients are None)."""
    grads = q.device.type != "cpu"
    q, k, v = (x.detach().float().requires_grad_(grads) for x in (q, k, v))
    out = attend(flex_attention, q, k, v, block_causal_mask(lengths, seq, q.device))
    if grads:
        out.backward(dout.float())
    return out.detach(), q.grad, k.grad, v.grad


def masked_sdpa(q, k, v, dout, mask):
    """SDPA with a dense boolean mask [B, 1, S, S] on [B, S, H, D] tensors: out, dq, dk, dv in
    the inputs' dtype."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=q.shape[2] != k.shape[2])
    out = out.transpose(1, 2)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def check(path, device):
    (b, h, kvh, s, d), lengths, (q, k, v, dout, out, dq, dk, dv) = read_dump(path, device)
    ref = reference(q, k, v, dout, lengths, s)
    bf16_sdpa = masked_sdpa(q, k, v, dout, dense_mask(lengths, s, device))
    names = ("out", "dq", "dk", "dv")
    return {
        "check": {"batch": b, "heads": h, "kv_heads": kvh, "seq": s, "head_dim": d,
                  "doc_count": sum(len(x) for x in lengths)},
        "max_rel_err_vs_flex_fp32": {n: max_rel_err(x, r) for n, x, r in
                                     zip(names, (out, dq, dk, dv), ref)},
        "bf16_sdpa_masked_max_rel_err_vs_flex_fp32": {n: max_rel_err(x, r) for n, x, r in
                                                      zip(names, bf16_sdpa, ref)},
    }


def self_test(device):
    """FlexAttention under block_causal_mask against SDPA under dense_mask, fp32, on awkward
    shapes (lengths of 1, a sequence that is not a tile multiple, GQA), and the tile counts.
    On the CPU the outputs only: FlexAttention has no backward there."""
    cases = [
        ([[100, 37, 1, 162, 400], [700]], 4, 2, 64),
        ([[129, 128, 127, 1, 1, 314], [5] * 140], 6, 6, 32),
        ([[1] * 300, [299, 1]], 4, 1, 16),
    ]
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for lengths, h, kvh, d in cases:
        b, s = len(lengths), sum(lengths[0])
        validate_lengths(lengths, b, s)
        q, k, v, dout = (torch.randn(b, s, n, d, generator=gen).to(device)
                         for n in (h, kvh, kvh, h))
        with sdpa_kernel(SDPBackend.MATH):  # plain fp32 matmuls, as the reference's
            ref = masked_sdpa(q, k, v, dout, dense_mask(lengths, s, device))
        got = reference(q, k, v, dout, lengths, s)
        errors = [max_rel_err(x, r) for x, r in zip(ref, got) if r is not None]
        mask = dense_mask(lengths, s, device)
        block_tiles = block_mask_tiles(block_causal_mask(lengths, s, device))
        if max(errors) > 1e-4 or block_tiles != dense_mask_tiles(mask):
            raise SystemExit(f"torch_flex_attention: self-test failed for {lengths}: errors "
                             f"{errors}, BlockMask tiles {block_tiles}, dense mask tiles "
                             f"{dense_mask_tiles(mask)}")
        worst = max(worst, *errors)
    print(json.dumps({"self_test": "passed", "device": device, "cases": len(cases),
                      "max_rel_err_flex_vs_masked_sdpa": worst}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--frugal", help="bench_attention's JSON lines")
    parser.add_argument("--check", action="append", default=[], help="bench_attention --dump")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--mode", default="max-autotune-no-cudagraphs",
                        help="torch.compile mode for flex_attention ('default': none given)")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="for --self-test and --check; timing needs cuda")
    args = parser.parse_args()
    # The reference runs flex_attention eagerly on purpose (dense fp32 scores), not as a mistake.
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    if not (args.frugal or args.check or args.self_test):
        parser.error("nothing to do: give --frugal, --check or --self-test")
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    if args.frugal and args.device != "cuda":
        parser.error("--frugal (timing) needs --device cuda")
    print(json.dumps({"torch": torch.__version__, "device": args.device if args.device == "cpu"
                      else torch.cuda.get_device_name(), "flex_compile_mode": args.mode}),
          flush=True)
    if args.self_test:
        self_test(args.device)
    if args.frugal:
        # One compiled flex_attention for all cases, as torchtitan keeps one; static shapes, and
        # room for a compile per shape (a fall-back to eager after too many would be unfair).
        torch._dynamo.config.cache_size_limit = 64
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 64
        flex = torch.compile(flex_attention, dynamic=False,
                             mode=None if args.mode == "default" else args.mode)
        with open(args.frugal) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        results = compare(lines, flex, args.iters)
    for dump in args.check:
        print(json.dumps(check(dump, args.device)), flush=True)
    if args.frugal:
        summary_table(results)


if __name__ == "__main__":
    main()
