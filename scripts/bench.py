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
  engine-overlap
                the engine with its gradients packed in 8 buckets (--pack-bytes
                an eighth of the model's gradient bytes, last layer first);
                after timing, one step is profiled and the share of its
                reduction time that ran while backward did is reported

Each model gets its own image shape (resnet20 32x32x3, resnet50 224x224x3,
else 28x28x1) and 10 classes.

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
import math
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


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
    return measured(config, times)


def measured(config: dict, times: list[float]) -> dict:
    """The run's configuration with its step time and samples/s (and tokens/s
    for text) from the seconds of its timed blocks, and its last training
    loss. A run whose loss is not finite (or that stopped on a non-finite
    step: `config["failure"]`) trained nothing worth timing: it gets no rate."""
    row = {
        **config,
        "times": times,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    loss = config.get("loss")
    row["finite"] = bool(times) and (config["kind"] == "engine-dali-only" or (
        loss is not None and math.isfinite(loss)))
    if not row["finite"]:
        row.update(step_ms=None, images_per_sec=None)
        return row
    per_step = statistics.median(times) / config["steps"]
    batch = config["batch"] * config["n"]
    row.update(step_ms=1000 * per_step, images_per_sec=batch / per_step)
    if config.get("seq_len"):
        row["tokens_per_sec"] = row["images_per_sec"] * config["seq_len"]
    return row


def rate_of(row: dict) -> str:
    """A row's samples/s, or what its loss was when it has none."""
    if row.get("images_per_sec") is not None:
        return f"{row['images_per_sec']:,.0f}"
    return "loss " + ("nan" if row.get("loss") is None else f"{row['loss']}")


def device_worker(config: dict) -> dict:
    """One run of the one-device table (scripts/bench_gpu.py)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import bench_gpu

    if config.get("gpu"):
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise SystemExit("bench: --gpu needs a GPU, and this machine has none")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        config["device_name"] = name.replace("NVIDIA ", "").split()[0]  # H100, H200
    if bench_gpu.workload(config)["text"]:
        config["seq_len"] = bench_gpu.workload(config)["shape"][0]
    run = bench_gpu.run_keras if config["kind"] in bench_gpu.KERAS_KINDS else (
        bench_gpu.run_trainer)
    return measured(config, run(config))


def tower_devices(config: dict, n: int) -> list[str]:
    """The towers' devices: GPUs (logical ones of GPU 0 if there are fewer), or CPUs."""
    kind = "gpu" if config.get("gpu") else "cpu"
    return [f"/{kind}:{k}" for k in range(n)]


def towers_of(config: dict, n: int):
    """Towers for the data code: logical GPUs read through GPU 0 (DALI's device_id)."""
    import tensorflow as tf

    from engine.topology.devices import Tower
    from engine.topology.splits import logical_gpu_map

    physical = len(tf.config.list_physical_devices("GPU"))
    split = logical_gpu_map(n, 1) if config.get("gpu") and physical < n else {}
    return [Tower(k, device, n, split.get(device))
            for k, device in enumerate(tower_devices(config, n))]


def dali_options(batch: int, config: dict | None = None):
    """The synthetic DALI data every run reads, with tower-train's defaults for
    N towers (threads, prefetch) unless the configuration sweeps them; the
    reference recipes get the same."""
    from engine import data
    from engine.run import choices

    config = config or {}
    defaults = data.DataOptions(format="synthetic", train_path=None, val_path=None,
                                batch_size=batch, image_shape=shape_of(config))
    return dataclasses.replace(
        defaults,
        num_threads=config.get("dali_threads", choices.threads_per_pipeline(
            config.get("n", 1), gpus=bool(config.get("gpu")))),
        prefetch=config.get("prefetch", defaults.prefetch),
    )


def shape_of(config: dict | None) -> tuple[int, int, int]:
    """The images the configuration's model takes (its default, else MNIST's)."""
    from towers import models

    model = (config or {}).get("model", "mlp")
    return models.default_input_shape(model) or (28, 28, 1)


def build_model(config: dict):
    from towers import models

    return models.builder(config["model"])(shape_of(config), 10)


def hidden_fraction(step, iterators) -> float:
    """The share of one profiled step's reduction time during which backward
    ran too (engine.placement.overlap)."""
    from engine.placement import log as placement_log
    from engine.placement import overlap, report

    info = placement_log.RunInfo(towers=tuple(t.device for t in step.placement.towers),
                                 reduce_device=step.placement.reduce_device, parameters=0,
                                 parameter_bytes=0, batch_size=0, model="bench")
    log = placement_log.PlacementLog(None, info)
    for _ in range(2):  # captured, then profiled
        log.call("train", step.train, iterators)
    return overlap.overlap(report.slices(log.entries, "train")).hidden_fraction


def run_engine(config: dict) -> list[float]:
    import keras
    import tensorflow as tf

    from engine import reducers
    from engine.core import precision, variables
    from engine.core.outputs import StepOutputs
    from engine.core.step import TowerStep
    from engine.run import build as train
    from engine.topology.devices import Placement

    n = 1 if config["kind"].startswith("engine-1tower") else config["n"]
    batch = config["batch"] * config["n"] // n
    placement = Placement(tuple(towers_of(config, n)),
                          config.get("reduce_device", "/cpu:0"))
    keras.utils.set_random_seed(0)
    mode = config.get("variables", "reduce-device")
    def make_model():
        with precision.policy(config.get("dtype", "float32")):
            return build_model(config)

    copies = variables.make(mode, make_model, lambda: keras.optimizers.Adam(1e-3), placement,
                            xla=config.get("xla", False))
    if config.get("buckets"):
        gradient_bytes = sum(4 * int(v.shape.num_elements())
                             for v in copies.model.trainable_variables)
        config["pack_bytes"] = max(1, gradient_bytes // config["buckets"])
    step = TowerStep(
        variables=copies,
        placement=placement,
        reducer=reducers.build(reducers.ReducerOptions(
            name=config.get("reducer", "central"), pack_bytes=config.get("pack_bytes", 0)),
            placement),
        xla=config.get("xla", False),
    )
    if config["kind"].endswith("-memory"):
        iterators = []
        for tower in placement.towers:
            with tf.device(tower.device):
                images = tf.random.uniform([batch, *shape_of(config)])
                labels = tf.random.uniform([batch, 1], maxval=10, dtype=tf.int32)
                iterators.append(iter(tf.data.Dataset.from_tensors((images, labels)).repeat()))
    else:
        iterators = train.tower_iterators(dali_options(batch, config), placement, training=True)
    if config["kind"].endswith("-memory") and not config.get("gpu"):
        # How many ops a step runs (partitioned graphs exist on the first call
        # only): per-op overhead is what splitting a small model costs.
        from engine.placement.log import collect

        _, metadata = collect(step.train, iterators)
        config["ops_per_step"] = sum(len(graph.node) for function in metadata.function_graphs
                                     for graph in function.partition_graphs)
    per_loop = config.get("steps_per_loop", 1)
    if config["kind"] == "engine-dali-only":
        # The input alone: every tower's DALI batch fetched and dropped, no
        # model; the most images/s DALI can give the towers on this host.
        @tf.function
        def one(iterators):
            fetched = tf.add_n([tf.reduce_sum(next(it)[0]) for it in iterators])
            nothing = tf.constant(0.0)  # no model: nothing to lose
            return StepOutputs(nothing, nothing, fetched, False, nothing)
        run = one
    else:
        run = step.train
    last = {}

    def block(steps):
        """Runs `steps` steps (in loops of `per_loop`, the rest in a shorter
        loop) and returns the time they took; keeps the last outputs."""
        start = time.perf_counter()
        done = 0
        while done < steps:
            count = min(per_loop, steps - done)
            # What tower-train's loop reads after every loop: the non-finite
            # guard's flags (a host synchronisation, as in a real run).
            if per_loop == 1:
                last["out"] = run(iterators)
            else:
                last["out"] = step.train_loop(iterators, tf.constant(count, tf.int32))
            last["out"].finite.numpy()
            done += count
        return time.perf_counter() - start

    block(config["warmup"] * per_loop)
    times = []
    trace = config.get("trace")
    for repeat in range(config["repeats"]):
        if trace and repeat == config["repeats"] - 1:
            tf.profiler.experimental.start(trace)
        times.append(block(config["steps"]))
    if trace:
        tf.profiler.experimental.stop()
        from bench_gpu import gpu_profile

        config["profile"] = gpu_profile(trace, times[-1], config["steps"])
    config["loss"] = float(tf.reshape(last["out"].loss, [-1])[-1])
    if config.get("pack_bytes") and n > 1:
        config["hidden_fraction"] = hidden_fraction(step, iterators)
    return times


def run_keras_fit(model_fn, dataset, config, strategy=None) -> list[float]:
    import keras
    from bench_gpu import Timer

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
    config["loss"] = timer.loss()
    return timer.times


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_keras(config: dict) -> list[float]:
    import tensorflow as tf

    from engine.data.pipeline import tower_dataset

    batch = config["batch"] * config["n"]
    dataset = tower_dataset(dali_options(batch, config), towers_of(config, 1)[0], training=True)
    dataset = dataset.map(lambda x, y: (x, tf.reshape(y, [-1])))
    return run_keras_fit(lambda: build_model(config), dataset, config)


def run_mirrored(config: dict) -> list[float]:
    import tensorflow as tf

    from engine.data.pipeline import tower_dataset

    n = config["n"]
    towers = towers_of(config, n)
    strategy = tf.distribute.MirroredStrategy([t.device for t in towers])

    def per_replica(context):
        tower = towers[context.input_pipeline_id]
        with tf.device(tower.device):
            dataset = tower_dataset(dali_options(config["batch"], config), tower, training=True)
            return dataset.map(lambda x, y: (x, tf.reshape(y, [-1])))

    options = tf.distribute.InputOptions(
        experimental_place_dataset_on_device=True,
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )
    dataset = strategy.distribute_datasets_from_function(per_replica, options)
    return run_keras_fit(lambda: build_model(config), dataset, config, strategy)


def configurations(args) -> list[dict]:
    out = []
    one_device = args.gpu or args.one_device
    for model in args.models.split(","):
        towers = [1] if one_device else [int(x) for x in args.towers.split(",")]
        precisions = (args.mixed_precision or "").split(",") if one_device else [""]
        for n in towers:
            for batch in (int(b) for b in str(args.batch).split(",")):
                base = dict(model=model, n=n, batch=batch, steps=args.steps,
                            warmup=args.warmup, repeats=args.repeats, gpu=args.gpu)
                for precision in precisions:
                    if one_device:
                        base.update(precision=precision or None, classes=args.num_classes,
                                    one_device=True)
                    for kind, extra in (device_kinds(args) if one_device else CPU_KINDS):
                        out.append({**base, "kind": kind, **extra})
    return out


CPU_KINDS = [
    ("mirrored", {}), ("keras-1dev", {}),
    ("engine-reduce-device-central", {"variables": "reduce-device", "reducer": "central"}),
    ("engine-replicated-central", {"variables": "replicated", "reducer": "central"}),
    ("engine-replicated-ring", {"variables": "replicated", "reducer": "ring"}),
    ("engine-replicated-xla", {"variables": "replicated", "xla": True}),
    ("engine-bf16", {"dtype": "bfloat16"}),
    ("engine-1tower", {}), ("engine-dali-only", {}), ("engine-memory", {}),
    ("engine-1tower-memory", {}),
    ("engine-overlap", {"variables": "reduce-device", "reducer": "central",
                        "buckets": 8}),
]


def device_kinds(args) -> list[tuple[str, dict]]:
    """The one-device table (scripts/bench_gpu.py): the baselines, and the
    engine through towers.Trainer with its defaults and each alternative."""
    k = args.steps_per_loop
    kinds = [(kind, {}) for kind in ("keras-jit", "keras", "mirrored", "engine-default")]
    # engine-default chooses its steps per call; engine-loopK gives K (1: one a call).
    kinds += [(f"engine-loop{k}", {"steps_per_loop": k}), ("engine-noxla", {}),
              ("engine-host", {})]
    if args.jpeg_dir:
        kinds.append(("engine-jpeg", {"jpeg_dir": os.path.abspath(args.jpeg_dir)}))
    return kinds


def dali_configurations(args) -> list[dict]:
    """The input sweep: the engine fed by DALI with each thread count and
    prefetch depth, against the same steps on in-memory tensors."""
    out = []
    for model in args.models.split(","):
        for n in (int(x) for x in args.towers.split(",") if int(x) > 1):
            base = dict(model=model, n=n, batch=int(args.batch), steps=args.steps,
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


BASELINES = {"keras-jit": "Keras fit(jit_compile=True)",
             "mirrored": "the DALI + MirroredStrategy recipe",
             "engine-memory": "in-memory data"}


def chart(rows, path, title, reference):
    """Bars of each run's samples/s per workload; where the workloads count
    different samples (images and sequences), each bar is its rate over
    `reference`'s on the same workload instead, and the axis says so. A run
    without a rate (its loss not finite) has no bar. Returns the y axis's
    label (None: no chart, every run failed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("images_per_sec") is not None]
    groups = sorted({(r["model"], r["n"], r["batch"], r.get("precision") or "float32")
                     for r in timed})
    kinds = list(dict.fromkeys(r["kind"] for r in timed))
    if not kinds:
        return None  # every run failed: the table says why
    units = {unit_of(r) for r in timed}
    relative = len(units) > 1
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(kinds)
    colors = plt.get_cmap("tab20").colors  # one colour a run, up to 20 runs

    def value(group, kind):
        row = find(timed, kind, group[0], group[1], group[2], group[3])
        if row is None:
            return 0
        if not relative:
            return row["images_per_sec"]
        ref = find(timed, reference, *group)
        return row["images_per_sec"] / ref["images_per_sec"] if ref else 0

    for i, kind in enumerate(kinds):
        ax.bar([j + i * width for j in range(len(groups))],
               [value(g, kind) for g in groups], width, label=kind,
               color=colors[i % len(colors)])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m}, N={n}, batch {b}" + (f", {p}" if p != "float32" else "")
                        for m, n, b, p in groups], fontsize=8)
    baseline = BASELINES.get(reference, reference)
    label = f"samples/s relative to {baseline} (1.0)" if relative else units.pop()
    if relative:
        ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(label)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")
    return label


def reference_of(rows, dali_sweep: bool) -> str:
    """The baseline the table and chart compare with, from the runs
    themselves: in-memory data for the DALI sweep, else Keras'
    fit(jit_compile=True) where it ran, else the recipe."""
    if dali_sweep:
        return "engine-memory"
    kinds = {r["kind"] for r in rows}
    return "keras-jit" if "keras-jit" in kinds else "mirrored"


def chart_title(rows, reference: str, dali_sweep: bool) -> str:
    """The chart's title from the runs: what is compared against what, on which device."""
    if dali_sweep:
        return "DALI threads and prefetch against in-memory data (logical CPU devices)"
    devices = sorted({r["device_name"] for r in rows if r.get("device_name")})
    where = (f"one {', '.join(devices)}" if devices else
             "one GPU" if any(r.get("gpu") for r in rows) else "logical CPU devices")
    return f"tower-train against {BASELINES.get(reference, reference)} ({where})"


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
              f"{rate_of(r):>9} {unit_of(r)}, last loss {r.get('loss')}"
              + (f" ({r['failure']})" if r.get("failure") else ""),
              file=sys.stderr, flush=True)
    return rows


def find(rows, kind, model, n, batch=None, precision=None):
    """The timed run of `kind` on that workload (None where it has no rate:
    missing, or its loss not finite); `precision` (None: any) as the --gpu
    table's rows record it."""
    return next((r for r in rows if (r["kind"], r["model"], r["n"]) == (kind, model, n)
                 and batch in (None, r["batch"]) and r.get("images_per_sec") is not None
                 and precision in (None, r.get("precision") or "float32")), None)


def unit_of(row: dict) -> str:
    """What a row's rate counts: sequences for text (a model that reads
    them, as the zoo says), else images."""
    from towers import models

    reads = row.get("seq_len") or models.input_kind(row["model"]) == "sequences"
    return "sequences/s" if reads else "images/s"


def table(rows, reference: str) -> list[str]:
    """One line a run: samples/s (images, or sequences for text), or the
    loss of a run that has no rate because it was not finite; the last loss."""
    lines = [f"{'model':<12}{'N':>3}{'batch':>6} {'precision':<10}{'run':<30}{'samples/s':>12}"
             f"{'step ms':>9}{'loss':>9}{'RSS MB':>8}{'ops/step':>9}{'GPU busy':>9}"
             f"{'hidden':>8}{'vs ' + reference:>20}"]
    for r in rows:
        precision = r.get("precision") or "float32"
        ref = find(rows, reference, r["model"], r["n"], r["batch"], precision)
        timed = r.get("images_per_sec") is not None
        ratio = f"{r['images_per_sec'] / ref['images_per_sec']:.2f}x" if ref and timed else "-"
        busy = f"{r['profile']['gpu_busy_share']:.0%}" if "profile" in r else "-"
        hidden = f"{r['hidden_fraction']:.0%}" if "hidden_fraction" in r else "-"
        step_ms = f"{r['step_ms']:.2f}" if timed else "-"
        loss = "-" if r.get("loss") is None else f"{r['loss']:.4g}"
        lines.append(f"{r['model']:<12}{r['n']:>3}{r['batch']:>6} {precision:<10}"
                     f"{r['kind']:<30}{rate_of(r) if timed else 'not finite':>12}{step_ms:>9}"
                     f"{loss:>9}{r['peak_rss_mb']:>8.0f}{r.get('ops_per_step', '-'):>9}"
                     f"{busy:>9}{hidden:>8}{ratio:>20}")
        if r.get("failure"):
            lines.append(f"    {r['kind']}: {r['failure']}")
    return lines


def profiles(rows) -> list[str]:
    """Per profiled run: GPU busy time against the wall time of a step."""
    lines = []
    for r in rows:
        if "profile" in r:
            p = r["profile"]
            copies = ", ".join(f"{k} {v:.1f}" for k, v in sorted(p["copies_per_step"].items()))
            lines.append(f"  {r['model']} b{r['batch']} {r['kind']}: "
                         f"step {p['wall_ms_per_step']:.3f} ms, "
                         f"GPU busy {p['gpu_busy_ms_per_step']:.3f} ms "
                             f"({p['gpu_busy_share']:.0%}); "
                         f"{p['kernels_per_step']:.0f} kernels and copies per step ({copies})")
    return lines


def engines_of(rows, model, n, batch):
    """The engine's timed training runs (not the in-memory, one-tower or
    input-only ones, nor one whose loss was not finite)."""
    return [r for r in rows if (r["model"], r["n"], r["batch"]) == (model, n, batch)
            and r["kind"].startswith("engine-") and r.get("images_per_sec") is not None
            and not any(x in r["kind"] for x in ("1tower", "memory", "dali-only"))]


def check(name, value, goal) -> str:
    verdict = "met" if value >= goal else f"MISSED by {goal - value:.2f}"
    return f"  {name:<66} {value:5.2f} (target >= {goal}) {verdict}"


def targets(rows) -> list[str]:
    """Issue 6's targets (logical CPU devices), each met or missed by how much."""
    lines = []
    for model, n, batch in sorted({(r["model"], r["n"], r["batch"]) for r in rows if r["n"] > 1}):
        ref = find(rows, "mirrored", model, n, batch)
        engines = engines_of(rows, model, n, batch)
        if ref and engines:
            best = max(engines, key=lambda r: r["images_per_sec"])
            lines.append(check(f"{model} N={n}: engine ({best['kind']}) / recipe",
                               best["images_per_sec"] / ref["images_per_sec"], 1.5))
        split = find(rows, "engine-memory", model, n, batch)
        whole = find(rows, "engine-1tower-memory", model, n, batch)
        if split and whole:
            lines.append(check(f"{model} N={n}: {n} towers / 1 tower of {n}x the batch (in memory)",
                               split["images_per_sec"] / whole["images_per_sec"], 0.95))
    return lines


def device_targets(rows) -> list[str]:
    """The one-GPU targets (issue 36), each met or missed by how much: the
    engine's default against Keras `fit(jit_compile=True)` in the same
    precision, against the seed recipe, JPEG against generated data, and
    the GPU's busy share of the default step."""
    lines = []
    rate = lambda r: r["images_per_sec"]  # noqa: E731
    for model, batch, precision in sorted({(r["model"], r["batch"], r.get("precision")
                                            or "float32") for r in rows}):
        def of(kind):
            return find(rows, kind, model, 1, batch, precision)

        name = f"{model} b{batch} {precision}"
        for r in rows:
            workload = (r["model"], r["batch"], r.get("precision") or "float32")
            if workload == (model, batch, precision) and r.get("images_per_sec") is None:
                lines.append(f"  {name}: {r['kind']} MISSED: its loss was not finite "
                             f"({r.get('failure') or r.get('loss')}), so it has no rate")
        keras_jit, recipe, default, jpeg = (of(k) for k in (
            "keras-jit", "mirrored", "engine-default", "engine-jpeg"))
        heavy = model.startswith(("resnet50", "transformer"))
        if heavy and keras_jit and default:
            goal = 1.10 if model.startswith("resnet50") and batch < 256 else 1.15
            lines.append(check(f"{name}: engine default / Keras jit_compile",
                               rate(default) / rate(keras_jit), goal))
        if model.startswith("resnet50") and recipe and default:
            lines.append(check(f"{name}: engine default / recipe", rate(default) / rate(recipe),
                               1.5))
        if model.startswith("resnet50") and batch >= 256 and default and "profile" in default:
            lines.append(check(f"{name}: GPU busy share of the default step",
                               default["profile"]["gpu_busy_share"], 0.95))
        if jpeg and default:
            lines.append(check(f"{name}: JPEG decoded on the device / generated",
                               rate(jpeg) / rate(default), 0.9))
        if model in ("mlp", "lenet") and batch <= 64 and recipe and default:
            lines.append(check(f"{name}: engine default / recipe", rate(default) / rate(recipe),
                               2.0))
            if "profile" in default:
                p = default["profile"]
                host = p["wall_ms_per_step"] - p["gpu_busy_ms_per_step"]
                lines.append(f"  {name}: host time per step beyond the GPU's "
                             f"{host:.2f} ms (target <= 0.5) "
                             + ("met" if host <= 0.5 else f"MISSED by {host - 0.5:.2f}"))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", default="1,2,4")
    parser.add_argument("--models", default="mlp,lenet")
    parser.add_argument("--kinds", default=None,
                        help="comma-separated runs to measure (default: all)")
    parser.add_argument("--batch", default="64", help="per device; several: 64,256")
    parser.add_argument("--gpu", action="store_true",
                        help="the one-device table on GPU 0: Keras fit with and without "
                        "jit_compile, the recipe, and the engine's default and other modes "
                        "(scripts/bench_gpu.py)")
    parser.add_argument("--one-device", action="store_true",
                        help="the --gpu table's runs on the CPU (to check the bench itself)")
    parser.add_argument("--mixed-precision", default=None,
                        help="with --gpu: the compute dtype of the runs: auto, float16, "
                        "bfloat16, or several (float16,bfloat16), each a table of its own")
    parser.add_argument("--num-classes", type=int, default=1000,
                        help="with --gpu: classes of the image models' data")
    parser.add_argument("--jpeg-dir", default=None,
                        help="with --gpu: also train on JPEG files decoded on the GPU: this "
                        "file-list directory, written first (ImageNet-sized photos) if empty")
    parser.add_argument("--jpeg-count", type=int, default=4096,
                        help="how many JPEG files --jpeg-dir gets when it is written")
    parser.add_argument("--steps-per-loop", type=int, default=1,
                        help="K of the --gpu run engine-loopK (the default chooses its own)")
    parser.add_argument("--trace", action="store_true",
                        help="profile each engine run's last block: GPU busy time per step")
    parser.add_argument("--steps", type=int, default=50, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dali-sweep", action="store_true",
                        help="instead: DALI threads x prefetch against in-memory data")
    parser.add_argument("--startup", type=int, default=3,
                        help="times to measure tower-train's start (0: skip)")
    parser.add_argument("--merge", default=None, metavar="JSON,...",
                        help="instead of measuring: the table, targets and chart of the runs "
                        "in these bench.json files (with the same table flags)")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config = json.loads(args.worker)
        print(json.dumps(device_worker(config) if config.get("one_device") else worker(config)))
        return
    os.makedirs(args.out, exist_ok=True)
    if args.jpeg_dir and (args.gpu or args.one_device):
        import bench_gpu

        print(f"bench: JPEG files in {args.jpeg_dir} ({args.jpeg_count}, written if missing)",
              file=sys.stderr, flush=True)
        bench_gpu.make_jpegs(args.jpeg_dir, args.jpeg_count, args.num_classes)
    configs = dali_configurations(args) if args.dali_sweep else configurations(args)
    if args.kinds:
        wanted = args.kinds.split(",")
        configs = [c for c in configs if c["kind"] in wanted]
    if args.trace:
        for c in configs:
            if c["kind"].startswith("engine-"):
                c["trace"] = os.path.abspath(os.path.join(args.out, "traces", c["kind"]
                                                          + f"-{c['model']}-b{c['batch']}"))
    if args.merge:
        # Tables from runs measured earlier (several bench calls on one machine).
        rows = [row for path in args.merge.split(",")
                for row in json.load(open(path))["runs"]]
    else:
        rows = measure(configs)
    reference = reference_of(rows, args.dali_sweep)
    lines = table(rows, reference)
    if any("profile" in r for r in rows):
        lines += ["", "profiles:", *profiles(rows)]
    if not args.dali_sweep:
        lines += ["", "targets:", *(device_targets(rows)
                                    if args.gpu or args.one_device else targets(rows))]
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
          chart_title(rows, reference, args.dali_sweep), reference)
    print(f"wrote {args.out}/{name}.json and {args.out}/{name}.png")


if __name__ == "__main__":
    main()
