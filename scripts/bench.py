#!/usr/bin/env python3
"""Side-by-side speed: tower-train against the DALI + MirroredStrategy recipe and Keras.

For each model and tower count N it runs, each in a fresh process (logical
CPU devices are fixed per process), with the same per-device batch B and the
same DALI-generated synthetic data:

  mirrored      Keras model.fit under tf.distribute.MirroredStrategy over N
                devices, each replica fed by its own DALIDataset through
                distribute_datasets_from_function (DALI's multi-GPU recipe)
  keras-1dev    Keras model.fit on one device with the whole batch N*B
  engine-*      tower-train's step with each variable mode and main reducer
  engine-replicated-xla, engine-bf16
                the engine with --xla, and with --mixed-precision (bfloat16)
  engine-1tower tower-train with one tower and the whole batch (the no-split
                ceiling on a shared host)
  engine-dali-only
                the towers' DALI pipelines alone, batches fetched and dropped:
                the input's own ceiling on this host
  engine-memory, engine-1tower-memory
                the same two fed from in-memory tensors instead of DALI: their
                ratio is the tower efficiency

Warm-up steps are excluded; each figure is the median of --repeats timed
runs. Prints a table (images/s, step time, peak RSS, ratio to the recipe),
the issue's targets met or missed by how much, and tower-train's start-up
time, and writes bench.json and bench.png under --out. With --dali-sweep it
measures DALI's thread count and prefetch depth against in-memory data
instead (dali.json, dali.png).

    .venv/bin/python scripts/bench.py --towers 1,2,4 --models mlp,lenet
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def worker(config: dict) -> dict:
    """Runs one configuration in this process and returns its measurements."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    devices = max(config["n"], 1)
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * devices,
    )
    kind = config["kind"]
    run = {"mirrored": run_mirrored, "keras-1dev": run_keras}.get(kind, run_engine)
    times = run(config)
    per_step = statistics.median(times) / config["steps"]
    batch = config["batch"] * config["n"]
    return {
        **config,
        "step_ms": 1000 * per_step,
        "images_per_sec": batch / per_step,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def dali_options(batch: int, config: dict | None = None):
    """The synthetic DALI data every run reads, with tower-train's defaults for
    N towers (threads, prefetch) unless the configuration sweeps them; the
    reference recipes get the same."""
    from engine import data

    config = config or {}
    defaults = data.DataOptions(format="synthetic", train_path=None, val_path=None,
                                batch_size=batch)
    return dataclasses.replace(
        defaults,
        num_threads=config.get("dali_threads", data.default_threads(config.get("n", 1))),
        prefetch=config.get("prefetch", defaults.prefetch),
    )


def run_engine(config: dict) -> list[float]:
    import keras
    import tensorflow as tf

    from engine import precision, reducers, variables
    from engine.devices import DeviceRequest, resolve
    from engine.step import TowerStep
    from towers import models, train

    n = 1 if config["kind"].startswith("engine-1tower") else config["n"]
    batch = config["batch"] * config["n"] // n
    devices = [f"/cpu:{k}" for k in range(n)]
    placement = resolve(DeviceRequest(tuple(devices)), [f"/cpu:{k}" for k in range(max(config["n"], 1))])
    keras.utils.set_random_seed(0)
    mode = config.get("variables", "reduce-device")
    def make_model():
        with precision.policy(config.get("dtype", "float32")):
            return models.build(config["model"], (28, 28, 1), 10)

    step = TowerStep(
        variables=variables.make(
            mode, make_model, lambda: keras.optimizers.Adam(1e-3), placement),
        placement=placement,
        reducer=reducers.build(reducers.ReducerOptions(config.get("reducer", "central")), placement),
        xla=config.get("xla", False),
    )
    if config["kind"].endswith("-memory"):
        iterators = []
        for tower in placement.towers:
            with tf.device(tower.device):
                images = tf.random.uniform([batch, 28, 28, 1])
                labels = tf.random.uniform([batch, 1], maxval=10, dtype=tf.int32)
                iterators.append(iter(tf.data.Dataset.from_tensors((images, labels)).repeat()))
    else:
        iterators = train.tower_iterators(dali_options(batch, config), placement, training=True)
    if config["kind"].endswith("-memory"):
        # How many ops a step runs (partitioned graphs exist on the first call
        # only): per-op overhead is what splitting a small model costs.
        from engine.placement import collect

        _, metadata = collect(step.train, iterators)
        config["ops_per_step"] = sum(len(graph.node) for function in metadata.function_graphs
                                     for graph in function.partition_graphs)
    run = step.train
    if config["kind"] == "engine-dali-only":
        # The input alone: every tower's DALI batch fetched and dropped, no
        # model; the most images/s DALI can give the towers on this host.
        @tf.function
        def run(iterators):
            return {"loss": tf.add_n([tf.reduce_sum(next(it)[0]) for it in iterators])}
    for _ in range(config["warmup"]):
        run(iterators)["loss"].numpy()
    times = []
    for _ in range(config["repeats"]):
        start = time.perf_counter()
        for _ in range(config["steps"]):
            out = run(iterators)
        out["loss"].numpy()
        times.append(time.perf_counter() - start)
    return times


class Timer:
    """A Keras callback that times blocks of `steps` batches after warm-up."""

    def __init__(self, steps: int, warmup: int):
        import keras

        class Callback(keras.callbacks.Callback):
            def on_train_batch_end(inner, batch, logs=None):
                self.count += 1
                if self.count == warmup or (self.count > warmup and (self.count - warmup) % steps == 0):
                    now = time.perf_counter()
                    if self.start is not None:
                        self.times.append(now - self.start)
                    self.start = now

        self.callback = Callback()
        self.count, self.start, self.times = 0, None, []


def run_keras_fit(model_fn, dataset, config, strategy=None) -> list[float]:
    import keras

    timer = Timer(config["steps"], config["warmup"])
    total = config["warmup"] + config["steps"] * config["repeats"]
    if strategy is None:
        model = model_fn()
    else:
        with strategy.scope():
            model = model_fn()
    with strategy.scope() if strategy else _null():
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy", steps_per_execution=1)
    model.fit(dataset, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[timer.callback])
    return timer.times


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_keras(config: dict) -> list[float]:
    import tensorflow as tf

    from engine.data import tower_dataset
    from engine.devices import Tower
    from towers import models

    batch = config["batch"] * config["n"]
    dataset = tower_dataset(dali_options(batch, config), Tower(0, "/cpu:0", 1), training=True)
    dataset = dataset.map(lambda x, y: (x, tf.reshape(y, [-1])))
    return run_keras_fit(lambda: models.build(config["model"], (28, 28, 1), 10), dataset, config)


def run_mirrored(config: dict) -> list[float]:
    import tensorflow as tf

    from engine.data import tower_dataset
    from engine.devices import Tower
    from towers import models

    n = config["n"]
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(n)])

    def per_replica(context):
        k = context.input_pipeline_id
        with tf.device(f"/cpu:{k}"):
            dataset = tower_dataset(dali_options(config["batch"], config), Tower(k, f"/cpu:{k}", n),
                                    training=True)
            return dataset.map(lambda x, y: (x, tf.reshape(y, [-1])))

    options = tf.distribute.InputOptions(
        experimental_place_dataset_on_device=True,
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )
    dataset = strategy.distribute_datasets_from_function(per_replica, options)
    return run_keras_fit(lambda: models.build(config["model"], (28, 28, 1), 10), dataset,
                         config, strategy)


def configurations(args) -> list[dict]:
    out = []
    for model in args.models.split(","):
        for n in (int(x) for x in args.towers.split(",")):
            base = dict(model=model, n=n, batch=args.batch, steps=args.steps,
                        warmup=args.warmup, repeats=args.repeats)
            kinds = [("mirrored", {}), ("keras-1dev", {}),
                     ("engine-reduce-device-central", dict(variables="reduce-device", reducer="central")),
                     ("engine-replicated-central", dict(variables="replicated", reducer="central")),
                     ("engine-replicated-ring", dict(variables="replicated", reducer="ring")),
                     ("engine-replicated-xla", dict(variables="replicated", xla=True)),
                     ("engine-bf16", dict(dtype="bfloat16")),
                     ("engine-1tower", {}), ("engine-dali-only", {}), ("engine-memory", {}),
                     ("engine-1tower-memory", {})]
            for kind, extra in kinds:
                out.append({**base, "kind": kind, **extra})
    return out


def dali_configurations(args) -> list[dict]:
    """The input sweep: the engine fed by DALI with each thread count and
    prefetch depth, against the same steps on in-memory tensors."""
    out = []
    for model in args.models.split(","):
        for n in (int(x) for x in args.towers.split(",") if int(x) > 1):
            base = dict(model=model, n=n, batch=args.batch, steps=args.steps,
                        warmup=args.warmup, repeats=args.repeats)
            out.append({**base, "kind": "engine-memory"})
            for threads in (1, 2, 3):
                for prefetch in (1, 2, 4):
                    out.append({**base, "kind": f"engine-dali-t{threads}-p{prefetch}",
                                "dali_threads": threads, "prefetch": prefetch})
    return out


def startup_seconds(repeats: int) -> list[float]:
    """Wall time of `tower-train` running one step on real MNIST, end to end:
    an upper bound of the time from start to the first step."""
    command = [os.path.join(os.path.dirname(sys.executable), "tower-train"), "--devices",
               "cpu:2", "--epochs", "1", "--steps-per-epoch", "1", "--eval-steps", "0"]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def chart(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["n"]) for r in rows})
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(kinds)
    colors = plt.get_cmap("tab20").colors  # one colour a run, up to 20 runs
    for i, kind in enumerate(kinds):
        values = [next((r["images_per_sec"] for r in rows if (r["model"], r["n"]) == g
                        and r["kind"] == kind), 0) for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=kind,
               color=colors[i % len(colors)])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m}, N={n}" for m, n in groups])
    ax.set_ylabel("images/s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")


def measure(configs) -> list[dict]:
    """Runs each configuration in a fresh process (logical devices are fixed
    per process) and says each figure as it comes."""
    rows = []
    for count, config in enumerate(configs, 1):
        result = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            print(f"[{count}/{len(configs)}] {config['kind']} N={config['n']} "
                  f"{config['model']} failed: {result.stderr.strip().splitlines()[-1]}",
                  file=sys.stderr)
            continue
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"[{count}/{len(configs)}] {r['kind']:<30} {r['model']:<6} N={r['n']}: "
              f"{r['images_per_sec']:>9,.0f} images/s", file=sys.stderr, flush=True)
    return rows


def find(rows, kind, model, n):
    return next((r for r in rows if (r["kind"], r["model"], r["n"]) == (kind, model, n)), None)


def table(rows, reference: str) -> list[str]:
    lines = [f"{'model':<7}{'N':>3} {'run':<30}{'images/s':>10}{'step ms':>9}{'RSS MB':>8}"
             f"{'ops/step':>9}{'vs ' + reference:>20}"]
    for r in rows:
        ref = find(rows, reference, r["model"], r["n"])
        ratio = f"{r['images_per_sec'] / ref['images_per_sec']:.2f}x" if ref else "-"
        lines.append(f"{r['model']:<7}{r['n']:>3} {r['kind']:<30}{r['images_per_sec']:>10,.0f}"
                     f"{r['step_ms']:>9.2f}{r['peak_rss_mb']:>8.0f}"
                     f"{r.get('ops_per_step', '-'):>9}{ratio:>20}")
    return lines


def targets(rows) -> list[str]:
    """Issue 6's targets, each met or missed by how much."""
    lines = []

    def check(name, value, goal):
        verdict = "met" if value >= goal else f"MISSED by {goal - value:.2f}"
        lines.append(f"  {name:<62} {value:5.2f} (target >= {goal}) {verdict}")

    for model, n in sorted({(r["model"], r["n"]) for r in rows if r["n"] > 1}):
        ref = find(rows, "mirrored", model, n)
        engines = [r for r in rows if (r["model"], r["n"]) == (model, n)
                   and r["kind"].startswith("engine-")
                   and not any(x in r["kind"] for x in ("1tower", "memory", "dali-only"))]
        if ref and engines:
            best = max(engines, key=lambda r: r["images_per_sec"])
            check(f"{model} N={n}: engine ({best['kind']}) / recipe",
                  best["images_per_sec"] / ref["images_per_sec"], 1.5)
        split, whole = find(rows, "engine-memory", model, n), find(rows, "engine-1tower-memory", model, n)
        if split and whole:
            check(f"{model} N={n}: {n} towers / 1 tower of {n}x the batch (in memory)",
                  split["images_per_sec"] / whole["images_per_sec"], 0.95)
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", default="1,2,4")
    parser.add_argument("--models", default="mlp,lenet")
    parser.add_argument("--kinds", default=None,
                        help="comma-separated runs to measure (default: all)")
    parser.add_argument("--batch", type=int, default=64, help="per device")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dali-sweep", action="store_true",
                        help="instead: DALI threads x prefetch against in-memory data")
    parser.add_argument("--startup", type=int, default=3,
                        help="times to measure tower-train's start (0: skip)")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    os.makedirs(args.out, exist_ok=True)
    configs = dali_configurations(args) if args.dali_sweep else configurations(args)
    if args.kinds:
        wanted = args.kinds.split(",")
        configs = [c for c in configs if c["kind"] in wanted]
    rows = measure(configs)
    reference = "engine-memory" if args.dali_sweep else "mirrored"
    lines = table(rows, reference)
    if not args.dali_sweep:
        lines += ["", "targets:", *targets(rows)]
    report = {"runs": rows}
    if args.startup:
        start = startup_seconds(args.startup)
        report["startup_seconds"] = start
        worst = max(start)
        lines += [f"  tower-train start to the end of its first step (cpu:2, real MNIST), "
                  f"worst of {len(start)}: {worst:.1f} s (target <= 20) "
                  + ("met" if worst <= 20 else f"MISSED by {worst - 20:.1f} s")]
    print("\n".join(lines))
    name = "dali" if args.dali_sweep else "bench"
    with open(os.path.join(args.out, f"{name}.json"), "w") as stream:
        json.dump(report, stream, indent=1)
    chart(rows, os.path.join(args.out, f"{name}.png"),
          "DALI threads and prefetch against in-memory data" if args.dali_sweep
          else "tower-train against the DALI + MirroredStrategy recipe (logical CPU devices)")
    print(f"wrote {args.out}/{name}.json and {args.out}/{name}.png")


if __name__ == "__main__":
    main()
