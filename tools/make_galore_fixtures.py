#!/usr/bin/env python3
"""Writes tests/fixtures/galore/: galore-torch's GaLoreAdamW (proj_type std, exact SVD) on three
small matrices of awkward shapes over 12 steps with update_proj_gap 4 (refreshes at steps 0, 4
and 8: three refresh periods), which tests/unit/test_galore.cpp compares with frugal's
GaloreAdamW (galore.projector = svd, galore.stagger = false, galore.moments_on_refresh = keep).

  galore.safetensors   "<name>/weight0"        the initial weights, fp32
                       "<name>/grad/<t>"       the gradient of step t = 1..12, fp32
                       "<name>/weight/<t>"     the weights after step t = 4, 8, 12, fp32
                       __metadata__            hyperparameters and versions

The matrices: [24, 16] (m >= n: right projection), [12, 29] (left), [17, 17] (square: right),
rank 5. Gradients are a fixed random low-rank part with decaying singular values plus noise, so
the top singular vectors are well separated (each SVD is well conditioned in fp32).

Singular vectors have a sign each that LAPACK picks; GaLore keeps the moments across a refresh
in the new basis's coordinates, so the sign matters to the result. frugal fixes it (the largest
component of each right singular vector positive, the first of equal ones); this script gives
torch.linalg.svd the same convention (flipping a Vh row and its U column together, which is
still an SVD), and otherwise runs the reference as it is.

Usage: /tmp/peers-galore/bin/python tools/make_galore_fixtures.py [OUT_DIR]
  (python3 -m venv /tmp/peers-galore && /tmp/peers-galore/bin/pip install torch galore-torch
   safetensors numpy)
"""
import importlib.metadata
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

import galore_torch
from galore_torch import GaLoreAdamW

SHAPES = {
    "model.layers.0.self_attn.q_proj.weight": (24, 16),
    "model.layers.0.mlp.down_proj.weight": (12, 29),
    "model.layers.1.self_attn.o_proj.weight": (17, 17),
}
RANK, GAP, SCALE, STEPS = 5, 4, 0.25, 12
LR, BETAS, EPS, WEIGHT_DECAY = 0.01, (0.9, 0.95), 1e-8, 0.1
SAVED_STEPS = (4, 8, 12)

_svd = torch.linalg.svd


def svd_with_fixed_signs(a, full_matrices=True, **kwargs):
    u, s, vh = _svd(a, full_matrices=full_matrices, **kwargs)
    largest = vh.abs().argmax(dim=1)  # the first of equal maxima, as frugal
    signs = torch.sign(vh[torch.arange(vh.shape[0]), largest])
    signs[signs == 0] = 1
    return u * signs[: u.shape[1]], s, vh * signs[:, None]


def gradient(rng, shape, step):
    m, n = shape
    k = min(m, n)
    # A random low-rank signal with decaying singular values, new at each step, plus noise.
    u, _ = np.linalg.qr(rng.standard_normal((m, k)))
    v, _ = np.linalg.qr(rng.standard_normal((n, k)))
    s = 2.0 * 0.6 ** np.arange(k)
    return (u * s) @ v.T + 0.05 * rng.standard_normal((m, n))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "fixtures", "galore")
    os.makedirs(out_dir, exist_ok=True)
    torch.linalg.svd = svd_with_fixed_signs
    rng = np.random.default_rng(20240317)
    tensors = {}
    params = []
    for name, shape in SHAPES.items():
        w0 = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        tensors[name + "/weight0"] = torch.from_numpy(w0.copy())
        params.append(torch.nn.Parameter(torch.from_numpy(w0.copy())))
    optimizer = GaLoreAdamW(
        [{"params": params, "rank": RANK, "update_proj_gap": GAP, "scale": SCALE,
          "proj_type": "std"}],
        lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, correct_bias=True)
    for step in range(1, STEPS + 1):
        for (name, shape), p in zip(SHAPES.items(), params):
            g = gradient(rng, shape, step).astype(np.float32)
            tensors[f"{name}/grad/{step}"] = torch.from_numpy(g)
            p.grad = torch.from_numpy(g.copy())
        optimizer.step()
        if step in SAVED_STEPS:
            for name, p in zip(SHAPES, params):
                tensors[f"{name}/weight/{step}"] = p.detach().clone()
    metadata = {
        "rank": str(RANK), "update_proj_gap": str(GAP), "scale": str(SCALE), "steps": str(STEPS),
        "lr": str(LR), "beta1": str(BETAS[0]), "beta2": str(BETAS[1]), "eps": str(EPS),
        "weight_decay": str(WEIGHT_DECAY),
        "names": json.dumps(list(SHAPES)),
        "galore_torch": importlib.metadata.version("galore-torch"),
        "torch": torch.__version__,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(out_dir, "galore.safetensors"), metadata=metadata)
    print("wrote", os.path.join(out_dir, "galore.safetensors"), len(tensors), "tensors")


if __name__ == "__main__":
    main()
