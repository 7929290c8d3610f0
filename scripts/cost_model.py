"""How well the cost model predicts this machine: fit, then measure and compare.

For each setting (N logical CPU devices, and two loopback tower-workers), as
a user would: `tower-reduce-bench --fit-links FILE` in one process, then
`tower-reduce-bench --topology FILE` in another, which times central, ring,
tree and hierarchical on 64 KB to 16 MB and predicts each. Prints one table
per setting, the median absolute error, and how many pairs of reducers whose
measured times differ by more than 20% the model orders as measured.

    .venv/bin/python scripts/cost_model.py [--towers 2,4,8] [--workers]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.path.dirname(sys.executable)
SIZES = "64K,256K,1M,4M,16M"
REDUCERS = "central,ring,tree,hierarchical"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench(*args: str) -> None:
    subprocess.run([os.path.join(BIN, "tower-reduce-bench"), *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def setting(label: str, devices: str, extra: list[str], repeats: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        topology, rows = os.path.join(tmp, "fitted.json"), os.path.join(tmp, "rows.json")
        bench("--devices", devices, "--fit-links", topology, *extra)
        bench("--devices", devices, "--topology", topology, "--sizes", SIZES, "--reducers",
              REDUCERS, "--repeats", str(repeats), "--json", rows, *extra)
        with open(rows) as stream:
            measured = json.load(stream)
    from engine.cost.check import order_agreement, relative_errors

    print(f"\n{label}: fastest measured ms / predicted ms (error); median measured in []")
    sizes = list(dict.fromkeys(r["tensor_bytes"] for r in measured))
    names = list(dict.fromkeys(r["reducer"] for r in measured))
    print(f"{'size':>8}" + "".join(f"{n:>32}" for n in names))
    for size in sizes:
        cells = []
        for name in names:
            r = next(r for r in measured if r["reducer"] == name and r["tensor_bytes"] == size)
            error = (r["predicted_seconds"] - r["best_seconds"]) / r["best_seconds"]
            cells.append(f"{1e3 * r['best_seconds']:.2f} / {1e3 * r['predicted_seconds']:.2f} "
                         f"({100 * error:+.0f}%) [{1e3 * r['seconds']:.2f}]")
        print(f"{size >> 10:>7}K" + "".join(f"{c:>32}" for c in cells))
    errors = relative_errors(measured)
    agree, compared = order_agreement(measured)
    print(f"median absolute error {100 * statistics.median(map(abs, errors)):.0f}%; "
          f"order as measured for {agree} of {compared} pairs that differ by more than 20%")
    return measured


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", default="2,4,8")
    parser.add_argument("--workers", action="store_true", help="also two loopback workers")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    for n in [int(t) for t in args.towers.split(",") if t]:
        setting(f"{n} logical CPU devices", f"cpu:{n}", [], args.repeats)
    if args.workers:
        ports = [free_port(), free_port()]
        workers = [subprocess.Popen([os.path.join(BIN, "tower-worker"), "--port", str(p),
                                     "--cpus", "1"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL) for p in ports]
        try:
            time.sleep(5)
            cluster = "worker=" + ",".join(f"127.0.0.1:{p}" for p in ports)
            setting("two loopback tower-workers (towers w0/cpu:0, w1/cpu:0)",
                    "w0/cpu:0,w1/cpu:0", ["--cluster", cluster], args.repeats)
        finally:
            for w in workers:
                w.terminate()
                w.wait()


if __name__ == "__main__":
    main()
