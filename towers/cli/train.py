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

from towers.cli.common import (
    OneLineCommand,
    UsageFailure,
    check_output_dir,
    check_output_path,
    fail,
    import_tensorflow,
)

DEFAULT_DATA = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
    "tower-train",
    "mnist",
)


@click.command(name="tower-train", cls=OneLineCommand)
@click.option(
    "--devices",
    default="all",
    show_default=True,
    help="Towers: GPU indices (0,1,2,3), 'all' (every GPU, else one CPU tower "
    "per core), 'cpu:N' (N logical CPU devices), 'gpu:N' (N logical GPUs of GPU 0), "
    "or names (/gpu:1,/cpu:0).",
)
@click.option(
    "--gpu-memory",
    default=None,
    type=int,
    help="With --devices gpu:N: MiB of GPU 0's memory for each logical GPU "
    "(default 4096).",
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
@click.option("--steps-per-loop", default=1, show_default=True, type=int,
              help="Training steps per call of the compiled step: the host dispatches, "
              "and looks at progress, checkpoints and signals, once per K steps.")
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
@click.option("--checkpoint-dir", default=None,
              help="Save checkpoints here: at the end of every epoch, and every "
              "--checkpoint-every steps.")
@click.option("--checkpoint-every", default=0, show_default=True, type=int,
              help="Also save every K steps (0: only at the end of epochs).")
@click.option("--keep-checkpoints", default=3, show_default=True, type=int,
              help="Keep the newest M checkpoints.")
@click.option("--resume", is_flag=True,
              help="Continue from the newest good checkpoint in --checkpoint-dir.")
@click.option("--skip-nonfinite", is_flag=True,
              help="Skip (and count) steps whose loss or gradient is not finite "
              "instead of stopping.")
@click.option("--deterministic", is_flag=True,
              help="TensorFlow op determinism: runs with the same seed and devices "
              "give identical losses.")
@click.option("--xla", is_flag=True,
              help="Compile each tower's forward and backward pass with XLA, on the "
              "tower's device. Needs --variables replicated.")
@click.option("--mixed-precision", is_flag=True,
              help="Compute in bfloat16 on CPU towers, float16 on GPU towers (with "
              "dynamic loss scaling); variables and the loss stay float32.")
@click.option("--logdir", default=None,
              help="Write TensorBoard scalars here (loss, accuracy, step time each "
              "step; images/s and held-out numbers each epoch).")
@click.option("--profile-steps", default=None,
              help="A:B: a TensorFlow profiler trace of global steps A to B, in --logdir.")
@click.option("--placement-log", default=None,
              help="Write where every op of the first train and eval steps really "
              "ran, and what crossed devices, to this JSON Lines file; a summary "
              "is printed at the end.")
@click.option("--strict-placement", is_flag=True,
              help="Stop after the first step if any tower op ran outside its "
              "tower's device.")
@click.option("--log-device-placement", is_flag=True,
              help="Also turn on TensorFlow's own device placement printout.")
@click.option("--dali-threads", default=None, type=int,
              help="DALI worker threads per tower pipeline. Default: a quarter of "
              "this host's cores per tower (at least 1), leaving the rest to the towers.")
@click.option("--prefetch", default=2, show_default=True, type=int,
              help="DALI prefetch queue depth per tower pipeline.")
@click.option("--cluster", "cluster_spec", default=None,
              help="Train on remote towers too: the workers' addresses, e.g. "
              "worker=h1:2222,h2:2222 (each running tower-worker); add "
              "'chief=THIS_HOST:PORT;' in front when the workers are on other hosts. "
              "Default: TF_CONFIG's cluster, if set.")
@click.option("--connect-timeout", default=60.0, show_default=True, type=float,
              help="Seconds to wait for every cluster task to answer at start.")
@click.option("--step-timeout", default=300.0, show_default=True, type=float,
              help="With a cluster: seconds a step may take before the run stops "
              "and names the tasks that do not answer.")
def tower_train(
    devices,
    gpu_memory,
    reduce_device,
    data_path,
    data_format,
    model,
    batch_size,
    epochs,
    steps_per_epoch,
    steps_per_loop,
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
    checkpoint_dir,
    checkpoint_every,
    keep_checkpoints,
    resume,
    skip_nonfinite,
    deterministic,
    xla,
    mixed_precision,
    logdir,
    profile_steps,
    placement_log,
    strict_placement,
    log_device_placement,
    dali_threads,
    prefetch,
    cluster_spec,
    connect_timeout,
    step_timeout,
):
    """Train a model with one explicit tower per device."""
    from engine.data import pipeline as data
    from engine.topology import devices as devs

    try:
        request = devs.parse_request(devices, reduce_device, gpu_memory)
    except devs.DeviceError as err:
        raise UsageFailure(str(err))
    cluster = _cluster(cluster_spec, connect_timeout, request)
    if not step_timeout > 0:
        raise UsageFailure(f"--step-timeout ({step_timeout:g}) must be positive")
    profile = parse_profile_steps(profile_steps, logdir)
    if check_replicas and variable_mode != "replicated":
        raise UsageFailure(
            f"--check-replicas {check_replicas} compares replicated variables; "
            "add --variables replicated"
        )
    if xla and deterministic:
        raise UsageFailure(
            "--xla --deterministic: XLA has no deterministic version of some ops "
            "(max-pooling gradients, for one) and TensorFlow refuses them mid-run; "
            "drop one of the two flags"
        )
    for flag, value, least in (
        ("--batch-size", batch_size, 1),
        ("--dali-threads", 1 if dali_threads is None else dali_threads, 1),
        ("--prefetch", prefetch, 1),
    ):
        if value < least:
            raise UsageFailure(f"{flag} ({value}) must be at least {least}")
    for flag, path in (("--metrics", metrics_path), ("--placement-log", placement_log)):
        check_output_path(flag, path)
    for flag, path in (("--checkpoint-dir", checkpoint_dir), ("--logdir", logdir)):
        check_output_dir(flag, path)

    # A --data the user gave is checked now, before TensorFlow loads; the
    # default MNIST is prepared only once the devices are known to be good.
    given = data_path is not None or data_format == "synthetic"
    info = _inspect(data_path, data_format) if given else None
    _start_tensorflow(request, reducer, deterministic, log_device_placement)
    watchdog = None
    if cluster is not None:
        watchdog = _connect(cluster, step_timeout, checkpoint_dir)
    try:
        placement = devs.configure(request, _connector(cluster, watchdog))
    except devs.DeviceError as err:
        raise UsageFailure(str(err))
    if info is None:
        info = _default_dataset(data_format)
    towers = len(placement.towers)
    _check_data_fits(info, towers, batch_size)
    num_steps = steps_per_epoch
    if num_steps is None:
        num_steps = 100 if info.train_size is None else info.train_size // (
            batch_size * towers
        )
    if eval_steps is None:
        eval_steps = (
            data.eval_batches(info.val_size, batch_size, towers) if info.val_size else 0
        )

    from engine import reducers
    from engine.core import loop, precision
    from engine.run import trainer as train
    from engine.run.checkpoint import CheckpointOptions
    from towers import models

    try:
        models.resolve(model)
        compute_dtype = precision.mixed_dtype(placement) if mixed_precision else "float32"
        data_options = data.DataOptions(
            format=info.format,
            train_path=info.train_path,
            val_path=info.val_path,
            batch_size=batch_size,
            num_classes=info.num_classes,
            seed=seed,
            num_threads=dali_threads or data.default_threads(towers),
            prefetch=prefetch,
            checkpointing=checkpoint_dir is not None,
        )
        note = ""
        if lr is None:
            lr, note = train.default_learning_rate(optimizer, batch_size * towers)
        options = train.TrainOptions(
            data=data_options,
            model=train.ModelOptions(
                model, optimizer, lr, seed, note, variable_mode, compute_dtype, xla
            ),
            reducer=reducers.ReducerOptions(reducer, group_size, pack_bytes, compress),
            loop=loop.LoopOptions(
                epochs, num_steps, eval_steps, metrics_path, check_replicas,
                steps_per_loop=steps_per_loop,
            ),
            placement=train.PlacementOptions(placement_log, strict_placement),
            checkpoints=CheckpointOptions(
                checkpoint_dir, checkpoint_every, keep_checkpoints, resume,
                io_device=cluster.local_cpu if cluster else None,
            ),
            skip_nonfinite=skip_nonfinite,
            logdir=logdir,
            profile_steps=profile,
        )
    except ValueError as err:
        raise UsageFailure(str(err))
    _train(placement, options, info, cluster, watchdog)


def _cluster(spec, connect_timeout, request):
    """The cluster from --cluster, else from TF_CONFIG, else None; remote
    towers without one are refused."""
    from engine.topology import cluster as cluster_lib
    from engine.topology import devices as devs

    text = os.environ.get("TF_CONFIG") if spec is None else spec
    remote = [
        (flag, name)
        for flag, names in (("--devices", request.towers or ()),
                            ("--reduce-device", (request.reduce_device,)))
        for name in names
        if name and devs.task_of(name)
    ]
    if not text or not text.strip():
        if remote:
            flag, name = remote[0]
            raise UsageFailure(
                f"{flag}: {name} is on another task; name the cluster with "
                "--cluster worker=HOST:PORT,... (or TF_CONFIG)"
            )
        return None
    try:
        if spec is None:
            jobs, source = cluster_lib.from_tf_config(text), "TF_CONFIG"
        else:
            jobs, source = cluster_lib.parse(text), "--cluster"
        return cluster_lib.ClusterOptions(jobs, connect_timeout, source)
    except cluster_lib.ClusterError as err:
        raise UsageFailure(str(err))


def _connect(cluster, step_timeout, checkpoint_dir):
    """Waits for every task to answer; returns the watchdog that bounds the
    connection and each step from here on."""
    from engine.run.watchdog import Watchdog
    from engine.topology import cluster as cluster_lib

    try:
        cluster_lib.check_chief_port(cluster)
        cluster_lib.wait_for_tasks(cluster, lambda m: click.echo(f"tower-train: {m}"))
    except cluster_lib.ClusterError as err:
        fail("tower-train", str(err), 1)

    def overrun(what: str, seconds: float) -> None:
        down = cluster_lib.unreachable(cluster)
        frozen = [] if down else cluster_lib.silent(cluster)
        if down:
            detail = f"not answering: {'; '.join(down)}"
        elif frozen:
            detail = (f"accepting connections but not answering TensorFlow (frozen or "
                      f"overloaded): {'; '.join(frozen)}")
        else:
            detail = ("every task answers, so the work is slow or the workers cannot "
                      "reach this process (check the chief address and its port)")
        sys.stdout.flush()
        click.echo(f"tower-train: error: {what} has not finished after {seconds:.0f} s; "
                   f"{detail}; {_resume_advice(checkpoint_dir)}", err=True)
        sys.stderr.flush()

    return Watchdog(step_timeout, overrun, label=f"--step-timeout {step_timeout:g}")


def _connector(cluster, watchdog):
    """What configure() calls to connect, under the watchdog, or None."""
    if cluster is None:
        return None
    from engine.topology import cluster as cluster_lib

    def connect():
        import tensorflow as tf

        # Listing the devices is the first exchange with every task.
        watchdog.guard(
            f"connecting to the cluster (--connect-timeout {cluster.connect_timeout:g})",
            lambda: (cluster_lib.connect(cluster), tf.config.list_logical_devices()),
            timeout=cluster.connect_timeout,
        )

    return connect


def _resume_advice(checkpoint_dir) -> str:
    """Where the run can go on from, once its workers are back."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    if latest is None:
        return "no checkpoint was saved" + ("" if checkpoint_dir else " (no --checkpoint-dir)")
    return (f"the last checkpoint is {latest}; once every worker is up again, resume "
            f"with: {resume_command()}")


def _start_tensorflow(request, reducer, deterministic, log_device_placement) -> None:
    """Imports TensorFlow and sets what must be set before it starts."""
    from engine.topology import devices as devs

    if log_device_placement:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")  # TF prints it as INFO
    import_tensorflow()
    import tensorflow as tf

    if deterministic:
        tf.config.experimental.enable_op_determinism()
    if reducer == "collective":
        from engine.reducers.collective import reserve_inter_op_threads

        reserve_inter_op_threads(devs.expected_tower_count(request))
    if log_device_placement:
        tf.debugging.set_log_device_placement(True)


def _check_data_fits(info, towers: int, batch_size: int) -> None:
    """Every tower needs a held-out shard, and a training shard of a batch or more."""
    if info.val_size is not None and info.val_size < towers:
        raise UsageFailure(
            f"--data: {info.val_path} has {info.val_size} held-out samples, fewer than "
            f"the {towers} towers that each need a shard of it; add samples or remove "
            "val/"
        )
    if info.train_size is not None and info.train_size // towers < batch_size:
        raise UsageFailure(
            f"--batch-size {batch_size}: {info.train_path} has {info.train_size} "
            f"samples, {info.train_size // towers} per shard for {towers} towers, "
            "fewer than one batch; lower --batch-size or use fewer towers"
        )


def _inspect(data_path, data_format):
    from engine.data import pipeline as data

    try:
        return data.inspect(data_path, data_format)
    except data.DataError as err:
        raise UsageFailure(str(err))


def _default_dataset(data_format):
    """The default real MNIST, prepared on first use."""
    from engine.data import mnist

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


def _train(placement, options, info, cluster=None, watchdog=None):
    import tensorflow as tf

    from engine.core.variables import ReplicaDriftError
    from engine.data.pipeline import GpuUnavailableError
    from engine.placement.log import StrayPlacementError
    from engine.reducers import ReducerError
    from engine.run import trainer as train
    from engine.run.checkpoint import CheckpointError
    from engine.run.guard import NonFiniteError
    from engine.run.signals import GracefulStop, StopRequested
    from towers.models import ModelError

    try:
        with GracefulStop() as stop:
            train.train(placement, options, info, stop=stop, watchdog=watchdog)
    except StopRequested as stopped:
        if stopped.checkpoint:
            where = (f"checkpoint saved: {stopped.checkpoint}; resume with: "
                     f"{resume_command()}")
        else:
            where = "no --checkpoint-dir, so nothing was saved"
        click.echo(f"tower-train: stopped by {stopped}; {where}", err=True)
        sys.exit(stopped.exit_code)
    except NonFiniteError as err:
        # Resuming replays the same data into the same state, so the way on
        # from the last good checkpoint skips the bad steps.
        last = (f"the last good checkpoint is {err.checkpoint}; go on from it, skipping "
                f"such steps, with: {resume_command('--skip-nonfinite')}"
                if err.checkpoint else "rerun with --skip-nonfinite to skip such steps")
        fail("tower-train", f"{err}; {last}", 1)
    except CheckpointError as err:
        fail("tower-train", str(err), 1)
    except (ModelError, GpuUnavailableError, ReducerError) as err:
        raise UsageFailure(str(err))
    except ValueError as err:  # Keras refusing the model while the step is traced
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = lines[-1] if lines else type(err).__name__  # the cause comes last
        raise UsageFailure(f"--model {options.model.model!r} cannot train here: {reason}")
    except OSError as err:
        fail("tower-train", f"cannot write {err.filename!r}: {err.strerror}", 1)
    except (StrayPlacementError, ReplicaDriftError) as err:
        fail("tower-train", str(err), 1)
    except tf.errors.OpError as err:
        if cluster is not None:
            from engine.topology import cluster as cluster_lib

            down = cluster_lib.unreachable(cluster)
            if down:
                fail("tower-train", f"lost {'; '.join(down)}; "
                     f"{_resume_advice(options.checkpoints.directory)}", 1)
        fail("tower-train", _explain_op_error(err, placement, info), 1)


def _explain_op_error(err, placement, info) -> str:
    """One line for a TensorFlow error during training; for a sample DALI
    could not decode, the tower that hit it and the sample(s) at fault."""
    from engine.data import check as data_check

    message = str(err.message)
    tower = data_check.failing_tower(message)
    where = ""
    if tower is not None and tower < len(placement.towers):
        where = f"tower {tower} ({placement.towers[tower].device}): "
    if data_check.is_decode_failure(message) and info.train_path:
        click.echo(f"tower-train: {where}DALI could not decode an image; "
                   f"checking {info.train_path} for the sample at fault...", err=True)
        def progress(count: int) -> None:
            click.echo(f"  {count} samples checked", err=True)

        bad = data_check.undecodable(info.format, info.train_path, progress)
        if info.val_path:
            bad += data_check.undecodable(info.format, info.val_path, progress)
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            return (f"{where}cannot decode {', '.join(bad[:3])}{more}; remove or "
                    "replace what is not a valid image")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    detail = next(
        (line for line in lines if "failure" in line or "rror" in line.split(":")[0]),
        lines[0] if lines else type(err).__name__,
    )
    return f"training failed: {where}{detail}"


def parse_profile_steps(text: str | None, logdir: str | None) -> tuple[int, int] | None:
    """`A:B` -> (A, B), 1 <= A <= B; the trace needs --logdir."""
    if text is None:
        return None
    first, _, last = text.partition(":")
    if not (first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last)):
        raise UsageFailure(
            f"--profile-steps {text!r} is not A:B with 1 <= A <= B, e.g. 20:25"
        )
    if logdir is None:
        raise UsageFailure("--profile-steps writes its trace to --logdir; add --logdir DIR")
    return int(first), int(last)


def resume_command(*extra: str) -> str:
    """The command line that was run, with --resume (and `extra` flags)."""
    import shlex

    args = [a for a in sys.argv[1:] if a not in ("--resume", *extra)]
    return shlex.join(["tower-train", *args, "--resume", *extra])


def main():
    tower_train.main(prog_name="tower-train")


if __name__ == "__main__":
    main()
