#!/usr/bin/env python3
"""Writes tests/fixtures/quant/: bitsandbytes' NF4 quantization (quantize_4bit, quant_type='nf4',
blocksize 64, compress_statistics=True, CPU path) of a fixed fp32 matrix, which
tests/unit/test_quant.cpp compares with frugal's byte for byte.

  nf4_input.f32.bin          the [20, 896] input, fp32 little-endian
  nf4_codes.u8.bin           packed codes (high nibble = even element)
  nf4_absmax_codes.u8.bin    8-bit codes of absmax - offset (280 blocks)
  nf4_absmax_scales.f32.bin  second-level scales (2 groups of 256 blocks)
  nf4_absmax.f32.bin         the absmax values as bitsandbytes dequantizes them
  dynamic_map.f32.bin        create_dynamic_map(signed=True), before any quantization touched it
  nf4.json                   shape, offset, versions

Usage: /work/venv/bin/python tools/make_quant_fixtures.py [OUT_DIR]
       /work/venv/bin/python tools/make_quant_fixtures.py --print-dynamic-map
"""
import json
import os
import sys

import numpy as np
import torch
import bitsandbytes
import bitsandbytes.functional as F

ROWS, COLS, BLOCK = 20, 896, 64


def c_hex(v):
    """A float as a C++ hex float literal."""
    s = float(v).hex()
    if float(v) == 0.0:
        return "0.0f"
    mant, exp = s.split("p")
    mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}f"


def make_input():
    rng = np.random.default_rng(20240508)
    w = rng.standard_normal((ROWS, COLS)).astype(np.float32) * np.float32(0.02)
    w[0, 0:64] = 0.0  # an all-zero block
    w[1, 64:128] *= 0.1
    w[1, 100] = 1.5  # one large outlier
    w[2, 0:64] = -np.abs(w[2, 0:64])  # negative only
    # Exact NF4 midpoints: a block whose absmax is 1, so x * (1 / absmax) is x itself.
    code = F.get_4bit_type("nf4", device="cpu").float()
    mids = ((code[:-1] + code[1:]) / 2).numpy()
    w[3, 0:15] = mids
    w[3, 15:30] = -mids[::-1]
    w[3, 30] = 1.0
    w[3, 31:64] = 0.5
    w[4, 0:64] = 0.25  # a constant block (all codes 15)
    w[5, :] *= 40.0  # larger rows: absmax values spread out for the second level
    return w


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--print-dynamic-map":
        m = F.create_dynamic_map(signed=True).tolist()
        for i in range(0, 256, 4):
            print("    " + ", ".join(c_hex(v) for v in m[i : i + 4]) + ",")
        return
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "quant")
    os.makedirs(out_dir, exist_ok=True)
    dynamic_map = F.create_dynamic_map(signed=True).clone()  # before the CPU path edits it

    w = make_input()
    a = torch.from_numpy(w.copy())
    packed, state = F.quantize_4bit(a, blocksize=BLOCK, compress_statistics=True, quant_type="nf4")
    assert state.nested and state.state2.blocksize == 256
    absmax_dq = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    deq = F.dequantize_4bit(packed, state).float().reshape(-1)
    codes = packed.reshape(-1).numpy()
    nf4 = F.get_4bit_type("nf4", device="cpu").float()
    idx = torch.from_numpy(np.stack([codes >> 4, codes & 15], axis=1).reshape(-1).astype(np.int64))
    expect = nf4[idx] * absmax_dq.repeat_interleave(BLOCK)
    assert torch.equal(deq, expect), "dequantize_4bit != nf4[code] * absmax"

    def write(name, arr):
        arr.tofile(os.path.join(out_dir, name))

    write("nf4_input.f32.bin", w.astype("<f4"))
    write("nf4_codes.u8.bin", codes.astype(np.uint8))
    write("nf4_absmax_codes.u8.bin", state.absmax.numpy().astype(np.uint8))
    write("nf4_absmax_scales.f32.bin", state.state2.absmax.numpy().astype("<f4"))
    write("nf4_absmax.f32.bin", absmax_dq.numpy().astype("<f4"))
    write("dynamic_map.f32.bin", dynamic_map.numpy().astype("<f4"))
    meta = {
        "shape": [ROWS, COLS],
        "blocksize": BLOCK,
        "absmax_blocksize": state.state2.blocksize,
        "offset": float(state.offset),
        "offset_hex": float(state.offset).hex(),
        # bitsandbytes' CPU quantize_blockwise sets code[0] = -1 in the map it is given, and
        # dequantizes with that map; frugal keeps create_dynamic_map's value.
        "state2_code0": float(state.state2.code[0]),
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
    }
    with open(os.path.join(out_dir, "nf4.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
