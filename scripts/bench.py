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
  engine-1tower tower-train with one tower and the whole batch (the no-split
                ceiling on a shared host)
  engine-memory tower-train fed from in-memory tensors instead of DALI

Warm-up steps are excluded; each figure is the median of --repeats timed
runs. Prints a table (images/s, step time, peak RSS, ratio to the recipe) and
writes bench.json and bench.png under --out.

    .venv/bin/python scripts/bench.py --towers 1,2,4 --models mlp,lenet
"""

from __future__ import annotations

import argparse
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


def dali_options(batch: int):
    from engine import data

    return data.DataOptions(format="synthetic", train_path=None, val_path=None,
                            batch_size=batch, num_threads=1, prefetch=2)


def run_engine(config: dict) -> list[float]:
    import keras
    import tensorflow as tf

    from engine import reducers, variables
    from engine.devices import DeviceRequest, resolve
    from engine.step import TowerStep
    from towers import models, train

    n = 1 if config["kind"] == "engine-1tower" else config["n"]
    batch = config["batch"] * config["n"] // n
    devices = [f"/cpu:{k}" for k in range(n)]
    placement = resolve(DeviceRequest(tuple(devices)), [f"/cpu:{k}" for k in range(max(config["n"], 1))])
    keras.utils.set_random_seed(0)
    mode = config.get("variables", "reduce-device")
    step = TowerStep(
        variables=variables.make(
            mode, lambda: models.build(config["model"], (28, 28, 1), 10),
            lambda: keras.optimizers.Adam(1e-3), placement),
        placement=placement,
        reducer=reducers.build(reducers.ReducerOptions(config.get("reducer", "central")), placement),
    )
    if config["kind"] == "engine-memory":
        iterators = []
        for tower in placement.towers:
            with tf.device(tower.device):
                images = tf.random.uniform([batch, 28, 28, 1])
                labels = tf.random.uniform([batch, 1], maxval=10, dtype=tf.int32)
                iterators.append(iter(tf.data.Dataset.from_tensors((images, labels)).repeat()))
    else:
        iterators = train.tower_iterators(dali_options(batch), placement, training=True)
    for _ in range(config["warmup"]):
        step.train(iterators)["loss"].numpy()
    times = []
    for _ in range(config["repeats"]):
        start = time.perf_counter()
        for _ in range(config["steps"]):
            out = step.train(iterators)
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
    dataset = tower_dataset(dali_options(batch), Tower(0, "/cpu:0", 1), training=True)
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
            dataset = tower_dataset(dali_options(config["batch"]), Tower(k, f"/cpu:{k}", n),
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
                     ("engine-1tower", {}), ("engine-memory", {})]
            for kind, extra in kinds:
                out.append({**base, "kind": kind, **extra})
    return out


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["n"]) for r in rows})
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        values = [next((r["images_per_sec"] for r in rows if (r["model"], r["n"]) == g
                        and r["kind"] == kind), 0) for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=kind)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m}, N={n}" for m, n in groups])
    ax.set_ylabel("images/s")
    ax.set_title("tower-train against the DALI + MirroredStrategy recipe (logical CPU devices)")
    ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", default="1,2,4")
    parser.add_argument("--models", default="mlp,lenet")
    parser.add_argument("--batch", type=int, default=64, help="per device")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for config in configurations(args):
        result = subprocess.run([sys.executable, __file__, "--worker", json.dumps(config)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{config['kind']} N={config['n']} {config['model']} failed: "
                  f"{result.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            continue
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"measured {r['kind']:<30} {r['model']:<6} N={r['n']}: "
              f"{r['images_per_sec']:>9,.0f} images/s", file=sys.stderr, flush=True)
    print(f"{'model':<7}{'N':>3} {'run':<30}{'images/s':>10}{'step ms':>9}{'RSS MB':>8}"
          f"{'vs recipe':>10}")
    for r in rows:
        ref = next((x for x in rows if x["kind"] == "mirrored" and x["n"] == r["n"]
                    and x["model"] == r["model"]), None)
        ratio = f"{r['images_per_sec'] / ref['images_per_sec']:.2f}x" if ref else "-"
        print(f"{r['model']:<7}{r['n']:>3} {r['kind']:<30}{r['images_per_sec']:>10,.0f}"
              f"{r['step_ms']:>9.2f}{r['peak_rss_mb']:>8.0f}{ratio:>10}")
    with open(os.path.join(args.out, "bench.json"), "w") as stream:
        json.dump(rows, stream, indent=1)
    chart(rows, os.path.join(args.out, "bench.png"))
    print(f"wrote {args.out}/bench.json and {args.out}/bench.png")


if __name__ == "__main__":
    main()
