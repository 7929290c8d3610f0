#!/usr/bin/env python3
"""Benchmark: does --placement-log slow the steps after the captured one?

Runs tower-train alternately with and without --placement-log, several times,
on the same devices and data, and compares training images/s of the epochs
after the first (the first holds tracing and the captured step). Prints the
median of each and their ratio.

    .venv/bin/python scripts/bench_placement.py --devices cpu:2 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

BIN = os.path.dirname(sys.executable)


def run(args, log: bool, tmp: str) -> list[float]:
    metrics = os.path.join(tmp, "m.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    command = [
        os.path.join(BIN, "tower-train"), "--devices", args.devices,
        "--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps),
        "--eval-steps", "0", "--metrics", metrics, *args.data,
    ]
    if log:
        command += ["--placement-log", os.path.join(tmp, "placement.jsonl")]
    subprocess.run(command, check=True, capture_output=True)
    with open(metrics) as stream:
        epochs = [json.loads(line) for line in stream]
    return [e["images_per_sec"] for e in epochs[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu:2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--data", default=None, help="default: tower-train's default MNIST")
    args = parser.parse_args()
    args.data = ["--data", args.data] if args.data else []
    results = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for log in (False, True):
                speeds = run(args, log, tmp)
                results[log] += speeds
                print(f"repeat {i + 1}/{args.repeats} {'with' if log else 'without'} "
                      f"--placement-log: {statistics.median(speeds):,.0f} images/s",
                      flush=True)
    plain, logged = (statistics.median(results[k]) for k in (False, True))
    print(f"\n{'run':<28}{'median images/s':>16}{'epochs':>8}")
    print(f"{'without --placement-log':<28}{plain:>16,.0f}{len(results[False]):>8}")
    print(f"{'with --placement-log':<28}{logged:>16,.0f}{len(results[True]):>8}")
    print(f"ratio (with / without): {logged / plain:.3f}")


if __name__ == "__main__":
    main()
