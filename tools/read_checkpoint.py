#!/usr/bin/env python3
"""Reads whole tensors of a frugal checkpoint step through its index.h5 (h5py + numpy).

index.h5 holds one HDF5 virtual dataset per tensor ("model/<hf name>", "optim/exp_avg/<hf
name>", ...) that maps the rank files' row shards into the whole tensor. HDF5 fills the rows of
a missing source file with zeros without a word, so this reader first checks that every source
file exists and stops naming the missing one.

usage:
  tools/read_checkpoint.py STEP_DIR                    list the tensors with shape and norm
  tools/read_checkpoint.py STEP_DIR NAME [NAME ...]    print those tensors' shape, norm, first values
  tools/read_checkpoint.py STEP_DIR --compare-export HF_DIR
      every model/<name> tensor equal (bit for bit, fp32) to HF_DIR's safetensors, as written
      by `frugal export --dtype f32`; exit 1 naming the first that differs

STEP_DIR is a step directory (out/run/ckpt/step_00000100), or a run directory or its ckpt/
directory (its LATEST step). Needs h5py and numpy (not frugal's dependencies).
"""
import json
import os
import struct
import sys

import h5py
import numpy as np


def step_dir_of(path):
    for root in (path, os.path.join(path, "ckpt")):
        latest = os.path.join(root, "LATEST")
        if os.path.exists(latest):
            return os.path.join(root, open(latest).read().strip())
    return path


def open_index(step_dir):
    index = os.path.join(step_dir, "index.h5")
    if not os.path.exists(index):
        sys.exit(f"read_checkpoint: {step_dir} has no index.h5 (saved by a frugal without it?)")
    f = h5py.File(index, "r")
    missing = set()
    def check(name, obj):
        if isinstance(obj, h5py.Dataset) and obj.is_virtual:
            for source in obj.virtual_sources():
                if not os.path.exists(os.path.join(step_dir, source.file_name)):
                    missing.add(source.file_name)
    f.visititems(check)
    if missing:
        sys.exit(f"read_checkpoint: {index} reads {', '.join(sorted(missing))}, which "
                 f"{'is' if len(missing) == 1 else 'are'} missing from {step_dir}: the tensors "
                 "would read as zeros there")
    return f


def datasets(f):
    names = []
    f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    return names


def safetensors(directory):
    tensors = {}
    for file in sorted(os.listdir(directory)):
        if not file.endswith(".safetensors"):
            continue
        data = open(os.path.join(directory, file), "rb").read()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            raw = data[8 + length + begin:8 + length + end]
            dtype = {"F32": np.float32, "BF16": np.uint16}[info["dtype"]]
            value = np.frombuffer(raw, dtype=dtype).reshape(info["shape"])
            if info["dtype"] == "BF16":
                value = (value.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = value
    return tensors


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    step_dir = step_dir_of(argv[1])
    f = open_index(step_dir)
    if len(argv) >= 4 and argv[2] == "--compare-export":
        exported = safetensors(argv[3])
        compared = 0
        for name in datasets(f):
            if not name.startswith("model/"):
                continue
            hf_name = name[len("model/"):]
            if hf_name not in exported:
                continue  # e.g. a tied lm_head, written once as the embedding
            whole = f[name][()]
            if whole.shape != exported[hf_name].shape or not np.array_equal(whole, exported[hf_name]):
                sys.exit(f"read_checkpoint: {name} differs from {argv[3]}'s {hf_name}")
            compared += 1
        if compared == 0:
            sys.exit(f"read_checkpoint: no tensor of {step_dir} is in {argv[3]}")
        print(f"read_checkpoint: {compared} tensors of {step_dir}/index.h5 equal {argv[3]}'s")
        return 0
    names = argv[2:] or datasets(f)
    for name in names:
        if name not in f:
            sys.exit(f"read_checkpoint: {step_dir}/index.h5 has no tensor '{name}'")
        value = f[name][()]
        line = f"{name} {list(value.shape)} norm {np.linalg.norm(value.astype(np.float64)):.6g}"
        if argv[2:]:
            line += " first " + " ".join(f"{v:.6g}" for v in value.ravel()[:6])
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
