"""Compressed reduction against dense ring on real MNIST: bytes and accuracy.

Trains the mlp on 4 CPU towers with replicated variables, once per reducer,
for 3 epochs, and prints one markdown row per reducer: the bytes a train step
sends (the placement log's figure), what the reducer's module derives, the
share of dense ring's bytes, and the eval accuracy. The table in the docs (Reducers with state)
"Reducers with state" is this script's output.

    .venv/bin/python scripts/compression.py [--epochs 3] [--reducers ring,topk,...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

REDUCERS = ("ring", "topk", "powersgd", "signsgd", "localsgd")


def run(reducer: str, epochs: int, directory: str, seed: int = 1) -> dict:
    """One training run; returns its bytes and accuracy."""
    import towers
    from engine.placement import report

    log = os.path.join(directory, f"{reducer.split(':')[0]}.jsonl")
    trainer = towers.Trainer("cpu:4", model="mlp", reducer=reducer, variables="replicated",
                             batch_size=64, seed=seed, deterministic=True,
                             data=towers.data.mnist())
    started = time.monotonic()
    with open(os.devnull, "w") as quiet:
        trainer.stream = quiet
        records = trainer.fit(epochs=epochs, placement_log=log)
    entries = report.load(log)
    info = report.run_info(entries)
    return {
        "reducer": reducer,
        "bytes": sum(report.matrix(entries, "train").values()),
        "derived": report.reduction_bytes(info),
        "dense": report.dense_ring_bytes(info),
        "note": info.get("reduction_note", ""),
        "accuracy": records[-1]["eval_accuracy"],
        "seconds": time.monotonic() - started,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--reducers", default=",".join(REDUCERS))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for reducer in args.reducers.split(","):
            rows.append(run(reducer, args.epochs, directory, args.seed))
            row = rows[-1]
            print(f"{reducer}: {row['bytes']:,} bytes per step, eval accuracy "
                  f"{row['accuracy']:.4f} ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    dense = next((r["accuracy"] for r in rows if r["reducer"] == "ring"), None)
    print("| reducer | bytes per train step (log) | derived | of dense ring | "
          f"eval accuracy, {args.epochs} epochs | vs ring |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        derived = "-" if r["derived"] is None else f"{r['derived']:,}"
        share = f"{100.0 * r['bytes'] / r['dense']:.1f}%"
        versus = "" if dense is None else f"{100 * (r['accuracy'] - dense):+.2f} pt"
        note = f" ({r['note']})" if r["note"] else ""
        print(f"| `{r['reducer']}` | {r['bytes']:,}{note} | {derived} | {share} | "
              f"{r['accuracy']:.4f} | {versus} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
