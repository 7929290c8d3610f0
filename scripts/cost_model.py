"""How well the cost model predicts this machine: fit, then measure and compare.

For each setting (N logical CPU devices, and two loopback tower-workers), as
a user would: `tower-reduce-bench --fit-links FILE` in one process, then
`tower-reduce-bench --topology FILE` in another, which times central, ring,
tree and hierarchical on 64 KB to 16 MB and predicts each. Prints one table
per setting, the median absolute error, and how many pairs of reducers whose
measured times differ by more than 20% the model orders as measured.

    .venv/bin/python scripts/cost_model.py [--towers 2,4,8] [--workers] [--auto 2,4,8]

`--auto` times `--reducer auto` (choosing on costs it measures at start-up)
beside every fixed choice, size by size.
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
    agree, compared, ties = order_agreement(measured)
    print(f"median absolute error {100 * statistics.median(map(abs, errors)):.0f}%; "
          f"order as measured for {agree} of {compared} pairs measured more than 20% apart"
          + (f"; {ties} more such pairs the model predicts within 2% (ties)" if ties else ""))
    for r in measured:
        for o in measured:
            if (r["tensor_bytes"] == o["tensor_bytes"]
                    and r["best_seconds"] > 1.2 * o["best_seconds"]
                    and r["predicted_seconds"] < o["predicted_seconds"] / 1.02):
                print(f"  misordered: {o['reducer']} measured faster than {r['reducer']} "
                      f"at {o['tensor_bytes'] >> 10}K")
    return measured


def auto_against_fixed(devices: str, repeats: int) -> None:
    """`auto` timed beside every fixed choice, size by size: how far its
    fastest call is above the fastest fixed built-in's."""
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = os.path.join(tmp, "rows.json")
        bench("--devices", devices, "--sizes", SIZES, "--reducers", REDUCERS + ",auto",
              "--repeats", str(repeats), "--json", rows_path)
        with open(rows_path) as stream:
            rows = json.load(stream)
    print(f"\nauto against the fixed built-ins on {devices}: fastest call, ms; auto's "
          "choice's own row / the best fixed row, and auto's row / the best")
    print(f"{'size':>8}{'auto chose':>14}{'its row':>9}{'best fixed':>20}{'choice/best':>13}"
          f"{'auto':>8}{'auto/best':>11}")
    for size in dict.fromkeys(r["tensor_bytes"] for r in rows):
        at = [r for r in rows if r["tensor_bytes"] == size]
        auto = next(r for r in at if r["reducer"] == "auto")
        chosen = next(r for r in at if r["reducer"] == auto["chose"])
        best = min((r for r in at if r["reducer"] != "auto"), key=lambda r: r["best_seconds"])
        print(f"{size >> 10:>7}K{auto['chose']:>14}{1e3 * chosen['best_seconds']:>9.2f}"
              f"{best['reducer'] + ' ' + format(1e3 * best['best_seconds'], '.2f'):>20}"
              f"{chosen['best_seconds'] / best['best_seconds']:>13.2f}"
              f"{1e3 * auto['best_seconds']:>8.2f}"
              f"{auto['best_seconds'] / best['best_seconds']:>11.2f}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", default="2,4,8")
    parser.add_argument("--workers", action="store_true", help="also two loopback workers")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--auto", default="",
                        help="also time auto beside the fixed choices on these towers, "
                        "e.g. 2,4,8")
    args = parser.parse_args()
    for n in [int(t) for t in args.towers.split(",") if t]:
        setting(f"{n} logical CPU devices", f"cpu:{n}", [], args.repeats)
    for n in [int(t) for t in args.auto.split(",") if t]:
        auto_against_fixed(f"cpu:{n}", args.repeats)
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
