"""`tower-train`: parse flags into options, check them, train.

Everything that can be checked without TensorFlow is checked before it is
imported, so bad input fails in well under a second. Every error is one line on
stderr, `tower-train: error: ...`, with exit code 2 for bad input and 1 for a
failure during training.
"""

from __future__ import annotations

import os
import sys

import click

DEFAULT_DATA = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
    "tower-train",
    "mnist",
)


class UsageFailure(Exception):
    """Bad input: printed as one line, exit code 2."""


def fail(prog: str, message: str, code: int = 2) -> None:
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


class OneLineErrors:
    """Mixin for click commands and groups: usage errors are one line, exit 2."""

    def main(self, args=None, **kwargs):
        try:
            return super().main(args, standalone_mode=False, **kwargs)
        except click.exceptions.Abort:
            fail(self.name, "interrupted", 130)
        except click.UsageError as err:
            fail(self.name, err.format_message().replace("\n", " "))
        except UsageFailure as err:
            fail(self.name, str(err))


class OneLineCommand(OneLineErrors, click.Command):
    pass


class OneLineGroup(OneLineErrors, click.Group):
    pass


@click.command(name="tower-train", cls=OneLineCommand)
@click.option(
    "--devices",
    default="all",
    show_default=True,
    help="Towers: GPU indices (0,1,2,3), 'all' (every GPU, else one CPU tower "
    "per core), 'cpu:N' (N logical CPU devices), or names (/gpu:1,/cpu:0).",
)
@click.option(
    "--reduce-device",
    default=None,
    help="Where variables live and gradients are averaged. Default /cpu:0: host "
    "memory every tower reaches alike, present on every machine.",
)
@click.option(
    "--data",
    "data_path",
    default=None,
    help=f"Directory with train/ (and val/). Default: real MNIST in {DEFAULT_DATA}, "
    "prepared on first use.",
)
@click.option(
    "--data-format",
    default="auto",
    show_default=True,
    type=click.Choice(["auto", "caffe2", "folder", "synthetic"]),
    help="caffe2 = LMDB, folder = one sub-folder per class, synthetic = DALI-generated.",
)
@click.option("--model", default="mlp", show_default=True,
              help="mlp, lenet, or package.module:function returning a Keras model.")
@click.option("--batch-size", default=64, show_default=True, type=int,
              help="Samples per tower per step.")
@click.option("--epochs", default=5, show_default=True, type=int)
@click.option("--steps-per-epoch", default=None, type=int,
              help="Default: one pass over the training set.")
@click.option("--eval-steps", default=None, type=int,
              help="Held-out batches per tower after each epoch; 0 skips. "
              "Default: the whole held-out set once.")
@click.option("--optimizer", default="adam", show_default=True,
              type=click.Choice(["sgd", "momentum", "adam", "rmsprop"]))
@click.option("--lr", default=None, type=float,
              help="Learning rate. Default: the optimizer's rate for a batch of 32 "
              "(adam, rmsprop 0.001; sgd, momentum 0.01) scaled to the global batch: "
              "by its square root for adam and rmsprop, linearly for sgd.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--metrics", "metrics_path", default=None,
              help="Append one JSON line per epoch to this file.")
@click.option("--reducer", default="central", show_default=True,
              help="How gradients are averaged: central (on --reduce-device), ring, "
              "tree, hierarchical, collective, nccl (GPU only), or "
              "package.module:function (see the README for the contract).")
@click.option("--variables", "variable_mode", default="reduce-device", show_default=True,
              type=click.Choice(["reduce-device", "replicated"]),
              help="One copy of the variables on --reduce-device, or a copy per tower.")
@click.option("--group-size", default=2, show_default=True, type=int,
              help="Towers per group for --reducer hierarchical.")
@click.option("--pack-bytes", default=0, show_default=True, type=int,
              help="Fuse gradients into buffers of about this many bytes before "
              "reducing; 0 reduces each gradient alone.")
@click.option("--compress", default=None, type=click.Choice(["fp16", "bf16"]),
              help="Move gradients in this dtype, casting back after the transfer.")
@click.option("--check-replicas", default=0, show_default=True, type=int,
              help="With --variables replicated, compare the copies every K steps "
              "and stop if they drift apart.")
@click.option("--placement-log", default=None,
              help="Write where every op of the first train and eval steps really "
              "ran, and what crossed devices, to this JSON Lines file; a summary "
              "is printed at the end.")
@click.option("--strict-placement", is_flag=True,
              help="Stop after the first step if any tower op ran outside its "
              "tower's device.")
@click.option("--log-device-placement", is_flag=True,
              help="Also turn on TensorFlow's own device placement printout.")
@click.option("--dali-threads", default=2, show_default=True, type=int,
              help="DALI worker threads per tower pipeline.")
@click.option("--prefetch", default=2, show_default=True, type=int,
              help="DALI prefetch queue depth per tower pipeline.")
def tower_train(
    devices,
    reduce_device,
    data_path,
    data_format,
    model,
    batch_size,
    epochs,
    steps_per_epoch,
    eval_steps,
    optimizer,
    lr,
    seed,
    metrics_path,
    reducer,
    variable_mode,
    group_size,
    pack_bytes,
    compress,
    check_replicas,
    placement_log,
    strict_placement,
    log_device_placement,
    dali_threads,
    prefetch,
):
    """Train a model with one explicit tower per device."""
    from engine import data, devices as devs

    try:
        request = devs.parse_request(devices, reduce_device)
    except devs.DeviceError as err:
        raise UsageFailure(str(err))
    if check_replicas and variable_mode != "replicated":
        raise UsageFailure(
            f"--check-replicas {check_replicas} compares replicated variables; "
            "add --variables replicated"
        )
    for flag, value, least in (
        ("--batch-size", batch_size, 1),
        ("--dali-threads", dali_threads, 1),
        ("--prefetch", prefetch, 1),
    ):
        if value < least:
            raise UsageFailure(f"{flag} ({value}) must be at least {least}")
    for flag, path in (("--metrics", metrics_path), ("--placement-log", placement_log)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageFailure(f"{flag} {path!r}: its directory does not exist")

    # A --data the user gave is checked now, before TensorFlow loads; the
    # default MNIST is prepared only once the devices are known to be good.
    given = data_path is not None or data_format == "synthetic"
    info = _inspect(data_path, data_format) if given else None
    if log_device_placement:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")  # TF prints it as INFO
    import_tensorflow()
    if reducer == "collective":
        _threads_for_collectives(request)
    if log_device_placement:
        import tensorflow as tf

        tf.debugging.set_log_device_placement(True)
    try:
        placement = devs.configure(request)
    except devs.DeviceError as err:
        raise UsageFailure(str(err))
    if info is None:
        info = _default_dataset(data_format)
    towers = len(placement.towers)
    if info.train_size is not None and info.train_size // towers < batch_size:
        raise UsageFailure(
            f"--batch-size {batch_size}: {info.train_path} has {info.train_size} "
            f"samples, {info.train_size // towers} per shard for {towers} towers, "
            "fewer than one batch; lower --batch-size or use fewer towers"
        )
    num_steps = steps_per_epoch
    if num_steps is None:
        num_steps = 100 if info.train_size is None else info.train_size // (
            batch_size * towers
        )
    if eval_steps is None:
        eval_steps = (
            data.eval_batches(info.val_size, batch_size, towers) if info.val_size else 0
        )

    from engine import loop, reducers
    from towers import models, train

    try:
        models.resolve(model)
        data_options = data.DataOptions(
            format=info.format,
            train_path=info.train_path,
            val_path=info.val_path,
            batch_size=batch_size,
            num_classes=info.num_classes,
            seed=seed,
            num_threads=dali_threads,
            prefetch=prefetch,
        )
        note = ""
        if lr is None:
            lr, note = train.default_learning_rate(optimizer, batch_size * towers)
        options = train.TrainOptions(
            data=data_options,
            model=train.ModelOptions(model, optimizer, lr, seed, note, variable_mode),
            reducer=reducers.ReducerOptions(reducer, group_size, pack_bytes, compress),
            loop=loop.LoopOptions(
                epochs, num_steps, eval_steps, metrics_path, check_replicas
            ),
            placement=train.PlacementOptions(placement_log, strict_placement),
        )
    except ValueError as err:
        raise UsageFailure(str(err))
    _train(placement, options, info)


def _inspect(data_path, data_format):
    from engine import data

    try:
        return data.inspect(data_path, data_format)
    except data.DataError as err:
        raise UsageFailure(str(err))


def _default_dataset(data_format):
    """The default real MNIST, prepared on first use."""
    from engine import mnist

    if not mnist.is_prepared(DEFAULT_DATA):
        click.echo(
            f"tower-train: no MNIST in {DEFAULT_DATA} yet; preparing it "
            f"(the same as: tower-data mnist {DEFAULT_DATA})"
        )
        try:
            mnist.prepare(DEFAULT_DATA, log=lambda m: click.echo(f"  {m}"))
        except mnist.SourceError as err:
            raise UsageFailure(str(err))
    return _inspect(DEFAULT_DATA, data_format)


def _threads_for_collectives(request) -> None:
    """Collectives in one process each hold an inter-op thread while they wait
    for the others: give TensorFlow more threads than towers before it starts."""
    import tensorflow as tf

    from engine import devices as devs

    towers = len(request.towers) if request.towers else max(
        len(tf.config.list_physical_devices("GPU")), devs.default_cpu_towers()
    )
    current = tf.config.threading.get_inter_op_parallelism_threads()
    tf.config.threading.set_inter_op_parallelism_threads(
        max(current, devs.default_cpu_towers(), towers + 2)
    )


def _train(placement, options, info):
    import tensorflow as tf

    from engine.data import GpuUnavailableError
    from engine.placement import StrayPlacementError
    from engine.reducers import ReducerError
    from engine.variables import ReplicaDriftError
    from towers import train
    from towers.models import ModelError

    try:
        train.train(placement, options, info)
    except (ModelError, GpuUnavailableError, ReducerError) as err:
        raise UsageFailure(str(err))
    except (StrayPlacementError, ReplicaDriftError) as err:
        fail("tower-train", str(err), 1)
    except tf.errors.OpError as err:
        first = str(err.message).strip().splitlines()[0]
        fail("tower-train", f"training failed: {first}", 1)


def import_tensorflow() -> None:
    """Imports TensorFlow and the DALI plugin without their C++ start-up chatter.

    TensorFlow and the plugin log CUDA probing and CPU features to fd 2 before
    TF_CPP_MIN_LOG_LEVEL takes effect, so fd 2 is pointed at /dev/null for the
    imports alone. A user who sets TF_CPP_MIN_LOG_LEVEL sees everything.
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        import nvidia.dali.plugin.tf  # noqa: F401
        import tensorflow  # noqa: F401

        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import nvidia.dali.plugin.tf  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def main():
    tower_train.main(prog_name="tower-train")


if __name__ == "__main__":
    main()
