#!/usr/bin/env python3
"""Makes tests/fixtures/tensorboard/ with the `tensorboard` package: what its own readers make
of the event files a frugal run wrote (monitor.tensorboard).

The run: a tiny model trained on the fortunes for 8 steps, saving at step 4, dies at the start
of step 7 (FRUGAL_INJECT_FAULT=exit:0:7: steps 5 and 6 were written after the checkpoint) and
is resumed from step 4 to step 8, which writes steps 5 to 8 again into a second event file.
A second run of 30 steps, saving every 5, rolls back: a spike injected at step 22
(FRUGAL_INJECT_FAULT=spike:0:22, monitor.on_divergence=rollback) makes step 23's loss a spike,
the run returns to step 20 and trains steps 21 to 30 again, in the same event file.
Written here:
  events/             the two event files, as frugal wrote them
  run1.jsonl          the records of metrics.jsonl the first run wrote (steps 0 to 6)
  run2.jsonl          those the resumed run wrote (steps 5 to 8)
  metrics.jsonl       metrics.jsonl at the end (steps 0 to 4 of run 1, then run 2's)
  tensorboard.json    what tensorboard read:
    files: for each event file in name order, its events as EventFileLoader reads them:
           wall_time, step, and file_version, session_log (its status name) or scalars
           ({tag: simple_value})
    scalars: {tag: [[step, value], ...]} as the event accumulator TensorBoard's Python data
           provider uses (plugin_event_accumulator) holds them after reading the whole
           directory: one value per step, the resumed run's where both wrote one
    rollback: {"scalars": the same for the rolled-back run}
  rollback/events/    the rolled-back run's event file
  rollback/metrics.jsonl  its metrics.jsonl at the end (steps 21 to 23 of the first pass gone)
The script also checks, before writing, that every record is protobuf's own encoding of the
event it holds (Event.SerializeToString() of the parsed event gives the same bytes) and that the
legacy event_accumulator agrees with the plugin one.

tests/unit/test_tensorboard.cpp replays run1.jsonl and run2.jsonl through frugal's writer, with
the wall times read here, and compares the bytes with events/; and compares tensorboard.json's
scalars with metrics.jsonl: CI needs no Python.

Run (not in CI), with a venv outside the repository holding the tensorboard package:
  python3 -m venv /work/venv-tb && /work/venv-tb/bin/pip install tensorboard
  /work/venv-tb/bin/python tools/make_tensorboard_fixtures.py build/frugal \
      [--out tests/fixtures/tensorboard]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

CORPUS = "/usr/share/games/fortunes/fortunes"
TRAIN = [
    "--model.hidden_size=32", "--model.intermediate_size=64", "--model.num_hidden_layers=2",
    "--model.num_attention_heads=2", "--model.num_key_value_heads=1", "--model.vocab_size=512",
    "--model.max_position_embeddings=32", "--model.tie_word_embeddings=true",
    "--train.seq_len=16", "--train.micro_batch_size=2", "--train.steps=8", "--train.lr=5e-3",
    "--train.warmup_steps=2", "--train.eval_batches=1", "--train.eval_every=4",
    "--train.sample_tokens=0", "--ckpt.every=4", "--ckpt.async=false", "--monitor.log_every=2",
    "--parallel.device=cpu",
]


def run(cmd, env=None, expect=0):
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != expect:
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}, not {expect}:\n{done.stdout}")


def read_file(path):
    """The events of one file as EventFileLoader reads them."""
    events = []
    raw = list(event_file_loader.RawEventFileLoader(path).Load())
    for record in raw:
        event = event_pb2.Event.FromString(record)
        if event.SerializeToString() != record:
            sys.exit(f"{path}: a record is not protobuf's own encoding of its event")
        item = {"wall_time": event.wall_time, "step": event.step}
        what = event.WhichOneof("what")
        if what == "file_version":
            item["file_version"] = event.file_version
        elif what == "session_log":
            item["session_log"] = event_pb2.SessionLog.SessionStatus.Name(event.session_log.status)
        elif what == "summary":
            item["scalars"] = {v.tag: v.simple_value for v in event.summary.value}
        else:
            sys.exit(f"{path}: an event of kind {what}")
        events.append(item)
    # The loader TensorBoard uses reads the same events.
    if len(list(event_file_loader.EventFileLoader(path).Load())) != len(raw):
        sys.exit(f"{path}: EventFileLoader and RawEventFileLoader disagree")
    return events


def read_directory(path):
    """{tag: [[step, value], ...]} as TensorBoard's accumulators hold the directory."""
    plugin = plugin_event_accumulator.EventAccumulator(path, size_guidance={"tensors": 0})
    plugin.Reload()
    scalars = {}
    for tag in sorted(plugin.Tags()["tensors"]):
        scalars[tag] = [[e.step, float(tensor_util.make_ndarray(e.tensor_proto))]
                        for e in plugin.Tensors(tag)]
    legacy = event_accumulator.EventAccumulator(path, size_guidance={"scalars": 0})
    legacy.Reload()
    legacy_scalars = {tag: [[e.step, e.value] for e in legacy.Scalars(tag)]
                      for tag in sorted(legacy.Tags()["scalars"])}
    if legacy_scalars != scalars:
        sys.exit("the legacy event accumulator and the plugin one disagree")
    return scalars


def rollback_run(frugal, data, work, env):
    """The rolled-back run's directory of event files and its metrics.jsonl."""
    out_dir = os.path.join(work, "rollback")
    tb = os.path.join(out_dir, "tensorboard")
    train = [frugal, "train", f"--data.dir={data}", f"--train.out_dir={out_dir}",
             f"--monitor.tensorboard={tb}"] + TRAIN + [
                 "--train.steps=30", "--ckpt.every=5", "--train.eval_every=10",
                 "--monitor.on_divergence=rollback"]
    run(train, dict(env, FRUGAL_INJECT_FAULT="spike:0:22"))
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        metrics = f.read()
    if '"rollback":{"from_step":23' not in metrics:
        sys.exit("the rollback run did not roll back at step 23")
    return tb, metrics


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("frugal", help="the frugal binary")
    parser.add_argument("--out", default="tests/fixtures/tensorboard")
    args = parser.parse_args()
    frugal = os.path.abspath(args.frugal)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    with tempfile.TemporaryDirectory() as work:
        data, out_dir = os.path.join(work, "data"), os.path.join(work, "run")
        tb = os.path.join(out_dir, "tensorboard")
        run([frugal, "prepare", CORPUS, "--out", data, "--vocab-size", "512"], env)
        train = [frugal, "train", f"--data.dir={data}", f"--train.out_dir={out_dir}",
                 f"--monitor.tensorboard={tb}"] + TRAIN
        run(train, dict(env, FRUGAL_INJECT_FAULT="exit:0:7"), expect=3)
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            run1 = f.read()
        run(train + ["--train.resume=true"], env)
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            final = f.read()
        run2 = "".join(line + "\n" for line in final.splitlines() if json.loads(line)["step"] > 4)

        names = sorted(n for n in os.listdir(tb) if n.startswith("events.out.tfevents."))
        if len(names) != 2:
            sys.exit(f"expected two event files, found {names}")
        result = {"files": [{"name": n, "events": read_file(os.path.join(tb, n))} for n in names],
                  "scalars": read_directory(tb)}
        rollback_tb, rollback_metrics = rollback_run(frugal, data, work, env)
        rollback_names = os.listdir(rollback_tb)
        for n in rollback_names:
            read_file(os.path.join(rollback_tb, n))  # protobuf's own encoding, as above
        result["rollback"] = {"scalars": read_directory(rollback_tb)}

        if os.path.exists(args.out):
            shutil.rmtree(args.out)
        os.makedirs(os.path.join(args.out, "events"))
        for n in names:
            shutil.copyfile(os.path.join(tb, n), os.path.join(args.out, "events", n))
        for name, text in [("run1.jsonl", run1), ("run2.jsonl", run2), ("metrics.jsonl", final),
                           ("rollback/metrics.jsonl", rollback_metrics)]:
            os.makedirs(os.path.dirname(os.path.join(args.out, name)), exist_ok=True)
            with open(os.path.join(args.out, name), "w") as f:
                f.write(text)
        os.makedirs(os.path.join(args.out, "rollback", "events"))
        for n in rollback_names:
            shutil.copyfile(os.path.join(rollback_tb, n),
                            os.path.join(args.out, "rollback", "events", n))
        with open(os.path.join(args.out, "tensorboard.json"), "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
    print(f"wrote {args.out}: {len(names)} event files, {len(result['scalars'])} tags")


if __name__ == "__main__":
    main()
