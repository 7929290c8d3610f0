"""What simulated workers cost: N towers of batch B on one device against
one tower of batch N x B on the same device, same model, same data.

A study of 16 workers on one GPU is only cheap if the 16 towers cost little
more than the one big batch they add up to. Each configuration runs in a
process of its own (a device is split once per process) through the public
API, for three epochs of `--steps` steps; a step's time is the median of
the epochs after the first (which traces the step).

    .venv/bin/python scripts/simulated_workers.py --device gpu \\
        [--models resnet20,transformer] [--workers 16] [--batch 8] [--steps 40]

Prints one row per model and route, and the ratio of each route's step to
the one tower's (the issue's target: at most 1.5x); writes the rows to
`--out`/simulated-workers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

DATA = {"resnet20": "synthetic", "transformer": "text"}


def one_run(config: dict) -> dict:
    """Trains one configuration; returns its median step time."""
    import towers

    data = (towers.data.text() if DATA[config["model"]] == "text"
            else towers.data.synthetic(image_shape=(32, 32, 3)))
    trainer = towers.Trainer(config["devices"], model=config["model"], data=data,
                             batch_size=config["batch"], reducer=config["reducer"],
                             variables="replicated", xla=config["xla"],
                             stream=open(os.devnull, "w"))  # noqa: SIM115 - one process, one run
    records = trainer.fit(epochs=3, steps_per_epoch=config["steps"], eval_steps=0, verbose=0)
    step = statistics.median(r["seconds"] / r["steps"] for r in records[1:])
    towers_count = len(trainer.placement.towers)
    return {**config, "towers": towers_count, "step_ms": 1e3 * step,
            "samples_per_second": config["batch"] * towers_count / step}


def run(config: dict) -> dict:
    result = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)],
                            capture_output=True, text=True)
    if result.returncode:
        return {**config, "error": (result.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--models", default="resnet20,transformer")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8, help="per worker")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--xla", default="auto", choices=("auto", "on", "off", "both"))
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(one_run(json.loads(args.worker))))
        return
    unknown = [m for m in args.models.split(",") if m not in DATA]
    if unknown:
        parser.error(f"--models: {', '.join(unknown)} not among {', '.join(DATA)}")
    n, one_device = args.workers, "0" if args.device == "gpu" else "/cpu:0"
    xlas = {"auto": [None], "on": [True], "off": [False], "both": [False, True]}[args.xla]
    rows = []

    def measured(config: dict, route: str, base: dict | None = None) -> dict:
        """Runs one configuration (saying so first: a run traces for minutes)
        and prints its row as soon as it ends."""
        print(f"{config['model']:<12} xla {str(config['xla']):<5} {route:<36} ...", flush=True)
        row = {**run(config), "route": route}
        if base is not None and "step_ms" in row and "step_ms" in base:
            row["vs_one"] = row["step_ms"] / base["step_ms"]
        if "error" in row:
            print(f"{'':<22}{route:<36} error: {row['error']}", flush=True)
        else:
            ratio = f"{row['vs_one']:.2f}x" if "vs_one" in row else ""
            print(f"{'':<22}{route:<36} batch {row['batch']:>4} x {row['towers']:>2}  "
                  f"{row['step_ms']:8.1f} ms/step  {row['samples_per_second']:9.0f} "
                  f"samples/s  {ratio}", flush=True)
        rows.append(row)
        return row

    for model in args.models.split(","):
        for xla in xlas:
            base = measured({"model": model, "devices": one_device, "batch": n * args.batch,
                             "reducer": "central", "xla": xla, "steps": args.steps},
                            "one tower")
            for reducer in ("central", "powersgd:rank=2"):
                measured({"model": model, "devices": f"{args.device}:{n}", "batch": args.batch,
                          "reducer": reducer, "xla": xla, "steps": args.steps},
                         f"{n} simulated workers, {reducer}", base)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "simulated-workers.json"), "w") as stream:
        json.dump(rows, stream, indent=1)


if __name__ == "__main__":
    main()
