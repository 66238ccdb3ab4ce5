#!/usr/bin/env python3
"""Fixtures for frugal's 8-bit AdamW (optim.state_dtype = int8; kernels/blockwise_int8.h),
read by tests/unit/test_adamw_int8.cpp from tests/fixtures/adamw8bit/<source>/.

Every case is one weight [rows, cols] trained 100 steps on gradients that a formula gives (a
SplitMix64 hash of (seed, step, index), the same in the test), some with outliers: a few
elements whose gradients are 1000x the rest. Written per case: <case>.json (the settings) and
<case>.bin, little-endian: first-moment codes u8[n], second-moment codes u8[n], their absmax
f32[blocks] and f32[blocks], the final weight f32[n]; and code_maps.bin: bitsandbytes' signed
and unsigned dynamic maps, f32[256] each.

--source bnb       bitsandbytes.optim.AdamW8bit (the PyPI package) on --device: cuda is the
                   kernel its users train with (kOptimizerStatic8bit2StateBlockwise). Its blocks
                   are 256 values, fixed (the optimizer exposes no block size): only the cases
                   with block 256 are made. On cpu bitsandbytes (0.50) runs another algorithm
                   (quantization through a 65536-bin lookup table, weight decay before the step,
                   eps added after dividing by sqrt(1 - beta2^t)): those fixtures are not
                   comparable code for code, and the test does not read them.
--source reference an independent float32 NumPy implementation of the algorithm of bitsandbytes'
                   CUDA kernel as kernels/blockwise_int8.h states it (exact division and powers
                   where bitsandbytes uses __fdividef and __powf; scalars folded in double),
                   every operation rounded once: frugal's CPU twin must equal it bit for bit.
                   Also makes cases with blocks of 64 and 2048.
Needs numpy, torch and bitsandbytes (a peer of the tests, never a dependency of frugal):
  /work/venv/bin/python tools/make_adamw8bit_fixtures.py --source reference
  python tools/make_adamw8bit_fixtures.py --source bnb --device cuda      # on a GPU machine
"""
import argparse
import json
import math
import os

import numpy as np

STEPS = 100
# name, rows, cols, block, lr, beta1, beta2, eps, weight_decay, outliers
CASES = [
    ("plain", 16, 256, 256, 1e-3, 0.9, 0.999, 1e-8, 0.0, False),
    ("decay_wide", 8, 512, 256, 2e-3, 0.9, 0.95, 1e-8, 0.1, False),
    ("outliers", 16, 256, 256, 1e-3, 0.9, 0.999, 1e-8, 0.01, True),
    ("block64", 16, 256, 64, 1e-3, 0.9, 0.999, 1e-8, 0.01, True),
    ("block2048", 2, 2048, 2048, 1e-3, 0.9, 0.999, 1e-8, 0.01, True),
]
F32 = np.float32
MASK = (1 << 64) - 1


def splitmix(x):
    """SplitMix64's output function of a 64-bit state (numpy uint64 arrays)."""
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK)
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(MASK)
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(MASK)
        return z ^ (z >> np.uint64(31))


def uniform(seed, stream, n):
    """n floats in [-1, 1): 24 random bits each, exact in float32 (the test computes the same)."""
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        state = (np.uint64(seed) * np.uint64(0xD1B54A32D192ED03)
                 + np.uint64(stream) * np.uint64(0x9E3779B97F4A7C15) + i) & np.uint64(MASK)
    bits = (splitmix(state) >> np.uint64(40)).astype(np.int64)  # 24 bits
    return (bits.astype(np.float64) / float(1 << 23) - 1.0).astype(F32)


def initial_weight(n):
    return (uniform(7, 0, n) * F32(0.1)).astype(F32)


def gradient(step, n, outliers):
    g = (uniform(11, step, n) * F32(0.01)).astype(F32)
    if outliers:
        g[::509] *= F32(1000.0)  # a few elements a block, 1000x the rest
    return g


def code_maps():
    import bitsandbytes.functional as F
    return (F.create_dynamic_map(signed=True).numpy().astype(F32),
            F.create_dynamic_map(signed=False).numpy().astype(F32))


def reference(case, signed_map, unsigned_map):
    name, rows, cols, block, lr, b1, b2, eps, wd, outliers = case
    # The hyperparameters as the kernels receive them, floats (bitsandbytes' kernel arguments
    # are float too); the scalars are then folded in double.
    lr, b1, b2, eps, wd = (float(F32(x)) for x in (lr, b1, b2, eps, wd))
    n = rows * cols
    per_row = -(-cols // block)
    # element -> its block (row-wise blocks)
    col = np.arange(n) % cols
    blk = (np.arange(n) // cols) * per_row + col // block
    nb = rows * per_row
    mid1 = ((signed_map[:-1] + signed_map[1:]) * F32(0.5)).astype(F32)
    mid2 = ((unsigned_map[:-1] + unsigned_map[1:]) * F32(0.5)).astype(F32)
    p = initial_weight(n)
    q1 = np.zeros(n, np.uint8)
    q2 = np.zeros(n, np.uint8)
    a1 = np.zeros(nb, F32)
    a2 = np.zeros(nb, F32)
    for t in range(1, STEPS + 1):
        g = gradient(t, n, outliers)
        c1 = 1.0 - b1 ** t
        c2 = math.sqrt(1.0 - b2 ** t)
        step_size = F32(-lr * c2 / c1)
        eps_c2 = F32(c2 * eps)
        decay = F32(1.0 - lr * wd)
        s2 = (unsigned_map[q2] * a2[blk]).astype(F32)
        s2 = (s2 * F32(b2) + (F32(1.0 - b2) * g) * g).astype(F32)
        s1 = (signed_map[q1] * a1[blk]).astype(F32)
        s1 = (s1 * F32(b1) + F32(1.0 - b1) * g).astype(F32)
        a1 = np.zeros(nb, F32)
        a2 = np.zeros(nb, F32)
        np.maximum.at(a1, blk, np.abs(s1))
        np.maximum.at(a2, blk, np.abs(s2))
        p = (p + step_size * (s1 / (np.sqrt(s2) + eps_c2))).astype(F32)
        if wd > 0:
            p = (p * decay).astype(F32)
        x1 = np.where(a1[blk] > 0, s1 / np.where(a1[blk] > 0, a1[blk], F32(1)), F32(0)).astype(F32)
        x2 = np.where(a2[blk] > 0, s2 / np.where(a2[blk] > 0, a2[blk], F32(1)), F32(0)).astype(F32)
        # The nearest code: the midpoints below x; exactly on a midpoint, the even index (as
        # bitsandbytes' quantize_2D search ends).
        k1 = np.searchsorted(mid1, x1, side="left")
        k2 = np.searchsorted(mid2, x2, side="left")
        for k, x, mid in ((k1, x1, mid1), (k2, x2, mid2)):
            tie = (k < 255) & (mid[np.minimum(k, 254)] == x) & (k % 2 == 1)
            k[tie] += 1
        flip = np.signbit(signed_map[k1]) != np.signbit(s1)
        k1 = np.where(flip, np.where(s1 > 0, k1 + 1, k1 - 1), k1)
        q1 = k1.astype(np.uint8)
        q2 = k2.astype(np.uint8)
    return q1, q2, a1, a2, p


def bitsandbytes_run(case, device):
    import torch
    import bitsandbytes as bnb
    name, rows, cols, block, lr, b1, b2, eps, wd, outliers = case
    n = rows * cols
    w = torch.nn.Parameter(torch.from_numpy(initial_weight(n).reshape(rows, cols)).to(device))
    opt = bnb.optim.AdamW8bit([w], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for t in range(1, STEPS + 1):
        w.grad = torch.from_numpy(gradient(t, n, outliers).reshape(rows, cols)).to(device)
        opt.step()
    s = opt.state[w]
    assert s["state1"].dtype == torch.uint8, "bitsandbytes kept 32-bit state"
    cpu = lambda x: x.detach().cpu().numpy()
    return (cpu(s["state1"]).reshape(-1), cpu(s["state2"]).reshape(-1), cpu(s["absmax1"]),
            cpu(s["absmax2"]), cpu(w).reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", choices=["bnb", "reference"], required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="default: tests/fixtures/adamw8bit/<source>")
    a = ap.parse_args()
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    label = a.source if a.source == "reference" else "bnb_" + a.device
    out = a.out or os.path.join(root, "tests", "fixtures", "adamw8bit", label)
    os.makedirs(out, exist_ok=True)
    signed_map, unsigned_map = code_maps()
    with open(os.path.join(out, "code_maps.bin"), "wb") as f:
        f.write(signed_map.tobytes() + unsigned_map.tobytes())
    meta = {"source": label, "steps": STEPS, "cases": []}
    if a.source == "bnb":
        import bitsandbytes
        import torch
        meta["bitsandbytes"] = bitsandbytes.__version__
        meta["torch"] = torch.__version__
    for case in CASES:
        name, rows, cols, block, lr, b1, b2, eps, wd, outliers = case
        if a.source == "bnb" and block != 256:
            continue
        q1, q2, a1, a2, p = (reference(case, signed_map, unsigned_map) if a.source == "reference"
                             else bitsandbytes_run(case, a.device))
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            for x in (q1.astype(np.uint8), q2.astype(np.uint8), a1.astype("<f4"),
                      a2.astype("<f4"), p.astype("<f4")):
                f.write(x.tobytes())
        meta["cases"].append({"name": name, "rows": rows, "cols": cols, "block": block, "lr": lr,
                              "beta1": b1, "beta2": b2, "eps": eps, "weight_decay": wd,
                              "outliers": outliers})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("wrote", len(meta["cases"]), "cases to", out)


if __name__ == "__main__":
    main()
