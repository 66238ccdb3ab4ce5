#!/usr/bin/env python3
"""Validation loss against trained tokens for runs of different data.packing: the curve of
doc/packing.md. Reads each run's metrics.jsonl (trained_tokens per step, val_loss on evaluation
steps), prints a table of the validation losses at the trained tokens each run had reached, and
writes an SVG of the curves (standard library only: no plotting package needed).

usage: packing_curve.py --svg OUT.svg NAME=RUN_DIR [NAME=RUN_DIR ...]
"""
import argparse
import json
import sys
from pathlib import Path

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def curve(run_dir):
    """[(trained tokens so far, val_loss)] of a run, from its metrics.jsonl."""
    trained, points = 0, []
    for line in open(Path(run_dir) / "metrics.jsonl"):
        record = json.loads(line)
        trained += record.get("trained_tokens", 0)
        if record.get("val_loss") is not None:
            points.append((trained, record["val_loss"]))
    if not points:
        sys.exit(f"packing_curve: {run_dir}/metrics.jsonl has no val_loss")
    return points


def interpolate(points, x):
    """The validation loss at x trained tokens, linearly between evaluations (None outside)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return None


def svg(curves, path):
    width, height, left, bottom, top, right = 640, 400, 70, 50, 20, 150
    xs = [x for points in curves.values() for x, _ in points]
    ys = [y for points in curves.values() for _, y in points[1:]]  # step 0 is off the scale
    x_max, y_min, y_max = max(xs), min(ys), max(ys)
    y_min, y_max = y_min - 0.05 * (y_max - y_min), y_max + 0.05 * (y_max - y_min)

    def px(x):
        return left + (width - left - right) * x / x_max

    def py(y):
        return top + (height - top - bottom) * (y_max - min(max(y, y_min), y_max)) / (y_max - y_min)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" '
           'stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>']
    for i in range(6):
        x = x_max * i / 5
        out.append(f'<text x="{px(x):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{x / 1e3:.0f}k</text>')
        y = y_min + (y_max - y_min) * i / 5
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 12}" text-anchor="middle">'
               'trained tokens</text>')
    out.append(f'<text x="16" y="{(top + height - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + height - bottom) / 2})">validation loss</text>')
    for k, (name, points) in enumerate(curves.items()):
        colour = COLOURS[k % len(COLOURS)]
        path_points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points[1:])
        out.append(f'<polyline points="{path_points}" fill="none" stroke="{colour}" '
                   'stroke-width="2"/>')
        for x, y in points[1:]:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        out.append(f'<text x="{width - right + 10}" y="{top + 20 + 18 * k}" fill="{colour}">'
                   f'{name}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--svg", required=True)
    p.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    a = p.parse_args()
    curves = {}
    for run in a.runs:
        name, _, run_dir = run.partition("=")
        curves[name] = curve(run_dir)
    svg(curves, a.svg)
    # The first run's evaluations, and every run's loss at those trained tokens.
    names = list(curves)
    print("| trained tokens | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for x, _ in curves[names[0]]:
        values = [interpolate(curves[n], x) for n in names]
        print(f"| {x} | " + " | ".join("—" if v is None else f"{v:.4f}" for v in values) + " |")


if __name__ == "__main__":
    main()
