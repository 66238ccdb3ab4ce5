#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes frugal's bench_attention measured.

For every JSON line of --frugal (bench_attention's output) this times SDPA (bf16, is_causal,
enable_gqa when kv heads < heads) on the same shape and layout ([B, S, H, D] tensors seen as
[B, H, S, D]) and prints one JSON line with both figures and the ratios frugal / SDPA.
With --check DUMP (bench_attention --dump; repeatable) it runs SDPA on frugal's inputs and
prints, one line per dump, the max relative error, max |frugal - sdpa| / max |sdpa|, of
frugal's out, dq, dk and dv. Each timing line also says whether SDPA's gradients came out the
same bits in two runs on the same inputs (frugal's backward is deterministic; its GPU tests
check that). With --deterministic SDPA runs under torch.use_deterministic_algorithms(True),
which takes its deterministic backend (cuDNN's backward is refused there as not deterministic).

usage: torch_sdpa.py --frugal FRUGAL.jsonl [--check DUMP]... [--iters N] [--deterministic]
"""
import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F


def sdpa(q, k, v):
    """q [B, S, H, D], k/v [B, S, KVH, D] -> out [B, S, H, D]."""
    gqa = q.shape[2] != k.shape[2]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=gqa
    )
    return out.transpose(1, 2)


def median_ms(fn, iters):
    for _ in range(3):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        start[i].record()
        fn()
        stop[i].record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(start, stop))
    return times[len(times) // 2]


def time_sdpa(b, h, kvh, s, d, iters):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, amplitude=1.0):
        x = torch.rand(*shape, device="cuda", generator=gen) * 2 - 1
        return (x * amplitude).to(torch.bfloat16)

    q = rand(b, s, h, d, amplitude=2.0).requires_grad_()
    k = rand(b, s, kvh, d, amplitude=2.0).requires_grad_()
    v = rand(b, s, kvh, d).requires_grad_()
    dout = rand(b, s, h, d)

    def forward():
        with torch.no_grad():
            sdpa(q, k, v)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        sdpa(q, k, v).backward(dout)

    def gradients():
        forward_backward()
        return [x.grad.clone() for x in (q, k, v)]

    first, second = gradients(), gradients()
    repeatable = all(torch.equal(x, y) for x, y in zip(first, second))
    return median_ms(forward, iters), median_ms(forward_backward, iters), repeatable


def check(path):
    with open(path, "rb") as f:
        b, h, kvh, s, d = (int(x) for x in np.fromfile(f, dtype=np.int64, count=5))

        def bf16(*shape):
            n = int(np.prod(shape))
            x = torch.from_numpy(np.fromfile(f, dtype=np.int16, count=n).copy())
            return x.view(torch.bfloat16).reshape(*shape).cuda()

        def fp32(*shape):
            n = int(np.prod(shape))
            return torch.from_numpy(np.fromfile(f, dtype=np.float32, count=n).copy()).reshape(*shape).cuda()

        q, k, v, dout, out = (bf16(b, s, n, d) for n in (h, kvh, kvh, h, h))
        fp32(b, h, s)  # lse
        dq, dk, dv = fp32(b, s, h, d), fp32(b, s, kvh, d), fp32(b, s, kvh, d)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    ref = sdpa(q, k, v)
    ref.backward(dout)

    def rel(got, want):
        want = want.float()
        return float((got.detach().float() - want.detach()).abs().max() / want.detach().abs().max())

    return {
        "check": {"batch": b, "heads": h, "kv_heads": kvh, "seq": s, "head_dim": d},
        "max_rel_err_vs_sdpa": {
            "out": rel(out, ref), "dq": rel(dq, q.grad), "dk": rel(dk, k.grad), "dv": rel(dv, v.grad)
        },
        "sdpa_grads_dtype": str(q.grad.dtype),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--frugal", required=True)
    parser.add_argument("--check", action="append", default=[])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(args.deterministic)
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                      "sdpa_deterministic_algorithms": args.deterministic}))
    with open(args.frugal) as f:
        for line in f:
            fr = json.loads(line)
            b, h, kvh, s, d = (fr[x] for x in ("batch", "heads", "kv_heads", "seq", "head_dim"))
            fwd_ms, fwdbwd_ms, repeatable = time_sdpa(b, h, kvh, s, d, args.iters)
            fwd_flop = 4.0 * b * h * s * s * d / 2
            sdpa_fwd = fwd_flop / fwd_ms * 1e-9
            sdpa_fwdbwd = 3.5 * fwd_flop / fwdbwd_ms * 1e-9
            print(json.dumps({
                "batch": b, "heads": h, "kv_heads": kvh, "seq": s, "head_dim": d,
                "kernel": fr.get("kernel", "auto"),
                "frugal_fwd_tflops": fr["fwd_tflops"], "sdpa_fwd_tflops": round(sdpa_fwd, 1),
                "fwd_ratio": round(fr["fwd_tflops"] / sdpa_fwd, 3),
                "frugal_fwdbwd_tflops": fr["fwdbwd_tflops"],
                "sdpa_fwdbwd_tflops": round(sdpa_fwdbwd, 1),
                "fwdbwd_ratio": round(fr["fwdbwd_tflops"] / sdpa_fwdbwd, 3),
                "sdpa_grads_same_bits_twice": repeatable,
            }), flush=True)
    for dump in args.check:
        print(json.dumps(check(dump)), flush=True)


if __name__ == "__main__":
    main()
