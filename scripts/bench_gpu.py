"""The runs of `scripts/bench.py --gpu`: the engine through `towers.Trainer`
against the baselines a user would pick, on one device, with the same model,
batch, precision and DALI data (generated on the device, or JPEG files
decoded there).

  keras-jit     Keras `model.fit(jit_compile=True)` on one device: the whole
                train step compiled by XLA, Keras' default on a GPU
  keras         Keras `model.fit(jit_compile=False)`
  mirrored      the seed recipe: `fit` under `MirroredStrategy`, each replica
                fed by its own `DALIDataset` (DALI's multi-GPU example)
  engine-default
                `towers.Trainer` with nothing but the workload given: what
                `tower-train` does unless told otherwise
  engine-loopK  the same with `steps_per_loop=K` (engine-loop1: one step a call;
                the default chooses its own on a GPU)
  engine-noxla  the same with `xla=False` (the variables still on the GPU)
  engine-host   the variables on the host and no XLA: `reduce_device="/cpu:0"`,
                the default before the engine chose for GPUs
  engine-jpeg   the default flags on JPEG files, decoded and augmented on the
                device by DALI (`device="mixed"`)

Each engine figure is the median over `repeats` epochs of `steps` steps after a
first epoch that traces and compiles; each Keras figure the median over
`repeats` blocks of `steps` steps after `warmup` steps. Run through
`scripts/bench.py`, one process per run.
"""

from __future__ import annotations

import io
import os
import statistics
import time

ENGINE_KINDS = ("engine-default", "engine-noxla", "engine-host", "engine-jpeg")
KERAS_KINDS = ("keras-jit", "keras", "mirrored")


def device_of(config: dict) -> str:
    """The one device a run uses: GPU 0, or the CPU where a test runs the bench."""
    return "/gpu:0" if config.get("gpu") else "/cpu:0"


def workload(config: dict) -> dict:
    """What the model and the data are: `classes`, `shape` of one sample and
    `samples_unit` (images or sequences)."""
    from towers import models

    text = config["model"].startswith("transformer")
    shape = (config.get("seq_len", 128),) if text else (
        models.default_input_shape(config["model"]) or (28, 28, 1))
    return {"text": text, "shape": tuple(shape),
            "classes": 256 if text else config.get("classes", 10)}


def source(config: dict):
    """The `towers.data` source of a run: the text corpus, JPEG files, or
    DALI-generated images."""
    import towers

    work = workload(config)
    if work["text"]:
        return towers.data.text(seq_len=work["shape"][0])
    if config["kind"] == "engine-jpeg":
        return towers.data.directory(config["jpeg_dir"], "jpeg")
    return towers.data.synthetic(num_classes=work["classes"])


def run_trainer(config: dict) -> list[float]:
    """An engine run through the public API: seconds of each timed epoch.

    Records the header's chosen settings in `config["header"]` and, with
    `trace`, the GPU's busy share of one more profiled epoch."""
    import tensorflow as tf

    import towers
    from engine.run.guard import NonFiniteError

    kind = config["kind"]
    arguments = dict(model=config["model"], data=source(config), batch_size=config["batch"],
                     mixed_precision={None: False, "auto": True}.get(
                         config.get("precision"), config.get("precision")))
    if kind == "engine-noxla":
        arguments["xla"] = False
    if kind == "engine-host":
        arguments.update(xla=False, reduce_device="/cpu:0")
    stream = io.StringIO()
    devices = "0" if config.get("gpu") else "/cpu:0"
    trainer = towers.Trainer(devices, stream=stream, **arguments)
    fit = dict(steps_per_epoch=config["steps"], eval_steps=0,
               steps_per_loop=config.get("steps_per_loop"))
    try:
        history = trainer.fit(epochs=1 + config["repeats"], **fit)
    except NonFiniteError as error:  # a row that says so, not a rate
        config.update(loss=float("nan"), failure=str(error).splitlines()[0])
        return []
    config["loss"] = history[-1]["loss"]
    config["header"] = [line.strip() for line in stream.getvalue().splitlines()
                        if line.startswith(("  chosen", "  compute", "  reduce", "  replicas"))]
    if config.get("trace"):
        tf.profiler.experimental.start(config["trace"])
        profiled = trainer.fit(epochs=2 + config["repeats"], **fit)[-1]
        tf.profiler.experimental.stop()
        config["profile"] = gpu_profile(config["trace"], profiled["seconds"], config["steps"])
    return [record["seconds"] for record in history[1:]]


def keras_dataset(config: dict):
    """The engine's own DALI pipeline of the workload for a Keras run, on the device."""
    from engine import data
    from engine.run import choices
    from engine.topology.devices import Placement, Tower

    work = workload(config)
    tower = Tower(0, device_of(config), 1)
    info = source(config).inspect(lambda message: None)
    options = data.DataOptions(
        format=info.format, train_path=info.train_path, val_path=None,
        batch_size=config["batch"] * config.get("n", 1),
        image_shape=(28, 28, 1) if work["text"] else work["shape"],
        seq_len=info.seq_len or 0, num_classes=info.num_classes,
        num_threads=choices.dali_threads(Placement((tower,), tower.device)).value,
    )
    return options, tower


def build_keras_model(config: dict):
    """The zoo model, built under the run's precision policy."""
    from engine.core import precision
    from towers import models

    work = workload(config)
    with precision.policy(compute_dtype(config)):
        return models.builder(config["model"])(work["shape"], work["classes"])


def compute_dtype(config: dict) -> str:
    precision = config.get("precision")
    if not precision:
        return "float32"
    return precision if precision in ("float16", "bfloat16") else (
        "float16" if config.get("gpu") else "bfloat16")


def run_keras(config: dict) -> list[float]:
    """Keras `fit` on one device, fed the engine's DALI pipeline (`keras-jit`,
    `keras`), or under MirroredStrategy (`mirrored`, the seed recipe)."""
    import tensorflow as tf

    from engine.data.pipeline import tower_dataset

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)  # DALI needs its own
    options, tower = keras_dataset(config)
    kind = config["kind"]
    if kind == "mirrored":
        strategy = tf.distribute.MirroredStrategy([tower.device])

        def per_replica(context):
            with tf.device(tower.device):
                return tower_dataset(options, tower, training=True)

        dataset = strategy.distribute_datasets_from_function(
            per_replica, tf.distribute.InputOptions(
                experimental_place_dataset_on_device=True,
                experimental_fetch_to_device=False,
                experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA))
        with strategy.scope():
            model = build_keras_model(config)
            compile_keras(model, jit_compile=False)
        return fit_keras(model, dataset, config, tower.device)
    dataset = tower_dataset(options, tower, training=True)
    model = build_keras_model(config)
    compile_keras(model, jit_compile=kind == "keras-jit")
    return fit_keras(model, dataset, config, tower.device)


def compile_keras(model, *, jit_compile: bool) -> None:
    """Adam and the zoo's loss, as the engine trains them; under a float16
    policy Keras wraps the optimizer in its LossScaleOptimizer itself."""
    import keras

    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss="sparse_categorical_crossentropy", jit_compile=jit_compile)


def fit_keras(model, dataset, config: dict, device: str) -> list[float]:
    """Seconds of each timed block of `steps` batches, after `warmup`."""
    import tensorflow as tf

    timer = Timer(config["steps"], config["warmup"])
    total = config["warmup"] + config["steps"] * config["repeats"]
    with tf.device(device):  # a DALIDataset on a GPU is iterated there
        model.fit(dataset, epochs=1, steps_per_epoch=total, verbose=0,
                  callbacks=[timer.callback])
    config["loss"] = timer.loss()
    return timer.times


class Timer:
    """A Keras callback that times blocks of `steps` batches after `warmup`
    and keeps the last batch's logs: `loss()`, read once training is over
    (Keras' running mean of the epoch, so a single non-finite step shows)."""

    def __init__(self, steps: int, warmup: int):
        import keras

        outer = self

        class Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer.count += 1
                done = outer.count - warmup
                outer.logs = logs
                if done == 0 or (done > 0 and done % steps == 0):
                    now = time.perf_counter()
                    if outer.start is not None:
                        outer.times.append(now - outer.start)
                    outer.start = now

        self.callback = Callback()
        self.count, self.start, self.times, self.logs = 0, None, [], None

    def loss(self) -> float | None:
        """The last logged training loss, or None before the first batch."""
        if not self.logs or "loss" not in self.logs:
            return None
        return float(self.logs["loss"])


def gpu_profile(logdir: str, seconds: float, steps: int) -> dict:
    """What the GPU did in a profiled block of `steps` steps: the time some
    kernel or copy was running (the union of all streams' activity), the
    kernels and copies per step, and the busy share of the wall time."""
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from engine.placement.profile import DERIVED_LINES

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as stream:
        space.ParseFromString(stream.read())
    intervals, kernels, copies = [], 0, {}
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name in DERIVED_LINES:
                continue  # the same time as the kernels below them
            for event in line.events:
                begin = line.timestamp_ns + event.offset_ps / 1000
                intervals.append((begin, begin + event.duration_ps / 1000))
                name = names.get(event.metadata_id, "")
                if "memcpy" in name.lower():
                    kind = name.split()[0]
                    copies[kind] = copies.get(kind, 0) + 1
                else:
                    kernels += 1
    busy, end = 0.0, float("-inf")
    for begin, finish in sorted(intervals):
        if finish > end:
            busy += finish - max(begin, end)
            end = finish
    return {"gpu_busy_ms_per_step": busy / 1e6 / steps,
            "wall_ms_per_step": 1000 * seconds / steps,
            "gpu_busy_share": busy / 1e9 / seconds,
            "kernels_per_step": kernels / steps,
            "copies_per_step": {k: v / steps for k, v in copies.items()}}


def make_jpegs(root: str, count: int, classes: int, seed: int = 0) -> str:
    """Writes `count` JPEG photos of ImageNet's typical size (333 to 500
    pixels a side, about 110 KB at quality 90) and a `train.txt` file list
    with labels below `classes` to `root`, unless it is there; returns `root`.

    The pictures are smooth random colour fields with sensor-like noise: what
    a decoder spends its time on (entropy decoding, the inverse DCT, colour
    conversion) depends on the size and the detail of the image, not on what
    it shows."""
    import json
    from multiprocessing import Pool

    done = os.path.join(root, "train.txt")
    if os.path.isfile(done):
        return root
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    with Pool() as pool:
        labels = pool.map(_write_jpeg, [(root, k, classes, seed) for k in range(count)])
    with open(os.path.join(root, "meta.json"), "w") as stream:
        json.dump({"num_classes": classes}, stream)
    with open(done + ".partial", "w") as stream:
        stream.writelines(f"images/{k:06d}.jpg {label}\n" for k, label in enumerate(labels))
    os.rename(done + ".partial", done)
    return root


def _write_jpeg(job) -> int:
    import numpy as np
    from PIL import Image

    root, k, classes, seed = job
    rng = np.random.default_rng(seed * 1_000_003 + k)
    width, height = (int(x) for x in rng.integers(333, 501, 2))
    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    picture = np.asarray(field.resize((width, height), Image.BICUBIC), dtype=np.float32)
    picture += rng.normal(0.0, 10.0, picture.shape)
    Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8)).save(
        os.path.join(root, "images", f"{k:06d}.jpg"), quality=90)
    return int(rng.integers(0, classes))


def median_rate(times: list[float], samples_per_step: int, steps: int) -> float:
    return samples_per_step * steps / statistics.median(times)
