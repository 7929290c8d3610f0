"""A run's plan between its arguments and the built towers: the checks that
need no TensorFlow (rules across arguments included), then the options
resolved against the devices found (with the choices the engine made and
why), and the reducer check before the first step. The Trainer and the
command line make their runs through it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from engine import data as data_lib
from engine.core.progress import record_name
from engine.errors import UsageError

if TYPE_CHECKING:
    from engine.core.options import ModelOptions
    from engine.data import DataOptions
    from engine.reducers.options import ReducerOptions
    from engine.run.choices import Choice


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """What the towers are built from; `fit` adds the loop's options.

    Attributes:
      data: how every tower reads its shard.
      model: what to train and how.
      reducer: how the gradients are averaged.
      choices: the settings the run picked itself, for the header.
    """

    data: DataOptions
    model: ModelOptions
    reducer: ReducerOptions
    choices: tuple[Choice, ...] = ()


def check_numbers(*, batch_size: int, dali_threads: int | None, prefetch: int,
                  step_timeout: float, image_size: int | None = None,
                  learning_rate: float | None = None, xla: bool | None = None,
                  deterministic: bool = False) -> None:
    """Refuses counts and times out of range, naming the argument (the ones
    no options class holds before TensorFlow starts), and XLA with op
    determinism."""
    if xla and deterministic:
        raise UsageError(
            "<xla=True> <deterministic=True>: XLA has no deterministic version of "
            "some ops (max-pooling gradients, for one) and TensorFlow refuses them "
            "mid-run; drop one of the two flags"
        )
    if not step_timeout > 0:
        raise UsageError(f"<step_timeout> ({step_timeout:g}) must be positive")
    if learning_rate is not None and not learning_rate > 0:
        raise UsageError(f"<learning_rate> ({learning_rate}) must be positive")
    for argument, value in (("batch_size", batch_size),
                            ("dali_threads", 1 if dali_threads is None else dali_threads),
                            ("prefetch", prefetch),
                            ("image_size", 1 if image_size is None else image_size)):
        if value < 1:
            raise UsageError(f"<{argument}> ({value}) must be at least 1")


def check_groups(options, towers: int) -> None:
    """hierarchical's groups cannot be larger than the run: a `group_size`
    above the tower count is a mistake (a count meant for another machine)."""
    from engine.reducers.options import ReducerError

    if options.method == "hierarchical" and options.group_size > towers:
        raise ReducerError(f"<group_size> ({options.group_size}) is more than the run's "
                           f"{towers} tower{'s' * (towers != 1)}; give 1 to {towers}")


def check_data_fits(info, towers: int, batch_size: int, accumulate: int = 1) -> None:
    """Every tower needs a held-out shard, and a training shard of a step or
    more (`accumulate` batches)."""
    if info.val_size is not None and info.val_size < towers:
        raise UsageError(
            f"<data>: {info.val_path} has {info.val_size} held-out samples, fewer than "
            f"the {towers} towers that each need a shard of it; add samples or remove "
            "val/"
        )
    if info.train_size is not None and info.train_size // towers < batch_size:
        raise UsageError(
            f"<batch_size={batch_size}>: {info.train_path} has {info.train_size} "
            f"samples, {info.train_size // towers} per shard for {towers} towers, "
            "fewer than one batch; lower <batch_size> or use fewer towers"
        )
    if info.train_size is not None and info.train_size // towers < batch_size * accumulate:
        raise UsageError(
            f"<accumulate={accumulate}>: {info.train_size // towers} samples per shard "
            f"for {towers} towers hold {info.train_size // towers // batch_size} batches "
            f"of {batch_size}, fewer than one step of {accumulate}; lower <accumulate> "
            "or <batch_size>"
        )


def reducer_options(reducer, *, group_size: int | None, pack_bytes: int,
                    compress: str | None, topology):
    """The reducer's options, checked before TensorFlow starts (a built-in's
    name, a spec's parameters, a topology's file and fields, a `group_size`
    only where the reducer groups towers; None: its default, 2).

    Raises:
      ReducerError: as ReducerOptions.
      TopologyError: a missing or malformed topology file, naming the field.
    """
    from engine.cost import topology as topology_lib
    from engine.reducers.options import ReducerError, ReducerOptions

    options = ReducerOptions(name=reducer, group_size=2 if group_size is None else group_size,
                             pack_bytes=pack_bytes, compress=compress, topology=topology)
    if group_size is not None and options.method != "hierarchical":
        raise ReducerError(f"<group_size={group_size}> sets the groups of "
                           f"<reducer=hierarchical>; <reducer={options.label}> does not "
                           "group towers: drop <group_size>")
    if topology is None or isinstance(topology, topology_lib.Topology):
        return options
    try:
        loaded = topology_lib.load(str(topology))
    except topology_lib.TopologyError as err:
        raise topology_lib.TopologyError(f"<topology> {err}") from None
    return dataclasses.replace(options, topology=loaded)


def run_options(placement, info, source, image_shape, model_options, reducer, *,
                learning_rate, batch_size, mixed_precision, xla, dali_threads, prefetch,
                augment=None, deterministic=False, reduce_device_given=True) -> RunOptions:
    """The data and model options of a run on `placement` (`model_options` and
    `reducer` checked before TensorFlow started; images decoded to
    `image_shape`), and the settings it picked
    where the arguments left them open (`xla=None`, `dali_threads=None`,
    `reduce_device_given=False`, `learning_rate=None`)."""
    from engine.core import options as core_options
    from engine.core import precision
    from engine.core import variables as variables_lib
    from engine.run import choices

    variables, optimizer = model_options.variables, model_options.optimizer
    towers = len(placement.towers)
    compute_dtype = (precision.mixed_dtype(placement, mixed_precision) if mixed_precision
                     else "float32")
    picked = []
    if not reduce_device_given:
        picked.append(choices.reduce_device(placement))
    if xla is None:
        picked.append(choices.xla(placement, deterministic))
        xla = picked[-1].value
    elif xla:
        variables_lib.check_xla(variables, placement)
    if dali_threads is None:
        picked.append(choices.dali_threads(placement))
    threads = dali_threads or choices.dali_threads(placement).value
    picked.append(choices.layout(placement, compute_dtype, info.format != "text"))
    # The header names them where they differ from the CPU defaults of old.
    picked = tuple(c for c in picked if c is not None) if choices.gpu_towers(placement) else ()
    note = ""
    named = isinstance(optimizer, str) and optimizer in core_options.OPTIMIZERS
    if learning_rate is None and named:
        learning_rate, note = core_options.default_learning_rate(
            optimizer, batch_size * towers * model_options.accumulate)
    data_options = data_lib.DataOptions(
        format=info.format,
        train_path=info.train_path,
        val_path=info.val_path,
        batch_size=batch_size,
        image_shape=(28, 28, 1) if info.format == "text" else image_shape,
        seq_len=info.seq_len or 0,
        num_classes=info.num_classes,
        synthetic_samples=source.samples,
        stored_shape=info.image_shape,
        augment=info.augment if augment is None else augment,
        seed=model_options.seed,
        num_threads=threads,
        prefetch=prefetch,
        pipeline=source.function,
    )
    model_options = dataclasses.replace(
        model_options, learning_rate=model_options.learning_rate if learning_rate is None
        else learning_rate, learning_rate_note=note, compute_dtype=compute_dtype, xla=xla,
        metrics_top_k=model_options.top_k_for(info.num_classes))
    return RunOptions(data=data_options, model=model_options, reducer=reducer, choices=picked)


def check_fit(reducer, variables: str, **fit) -> None:
    """Every check of fit's arguments that needs nothing built: the loop's,
    the checkpoints' and the placement log's options (with what only the data
    can say left at a valid stand-in), and the files and folders it would
    write. The CLI makes them before TensorFlow starts; `fit` again, as it
    builds the same options for real.

    Raises:
      UsageError: the first bad argument, named.
    """
    fit_options(reducer, variables, None, 1, None, **fit)


def check_local_sgd(reducer, check_replicas: int) -> None:
    """Local SGD's replicas agree only right after an averaging step:
    `check_replicas` must fall on those. (Its need of replicated variables is
    LocalSGD.build's to refuse.)"""
    from engine import reducers

    if reducer.method != "localsgd":
        return
    every = (reducer.function.every if reducer.function is not None
             else reducer.arguments.get("every", reducers.parameters("localsgd")["every"]))
    if check_replicas % every:
        raise UsageError(
            f"<check_replicas={check_replicas}> is not a multiple of "
            f"<reducer={reducer.label}>'s every={every}; the replicas agree only right "
            "after an averaging step"
        )


def fit_options(reducer, variables: str, info, towers: int, cluster, *, epochs,
                steps_per_epoch, steps_per_loop, eval_steps, metrics, checkpoint_dir,
                checkpoint_every, keep_checkpoints, resume, placement_log, strict_placement,
                logdir, profile_steps, skip_nonfinite, check_replicas,
                max_transfer_bytes=None, keep_best=None, run: RunOptions | None = None,
                gpus: bool = False):
    """Everything `fit` runs with, its default epoch and evaluation lengths
    from the data (`info`; None: stand-ins, to check the arguments alone),
    and `steps_per_loop=None` chosen for GPU towers (`gpus`) or CPU ones.

    Raises:
      UsageError: a bad argument, named; nothing has been written.
    """
    from engine.core.options import LoopOptions
    from engine.run import choices, outputs
    from engine.run.options import CheckpointOptions, PlacementOptions, TrainOptions

    if check_replicas and variables != "replicated":
        raise UsageError(
            f"<check_replicas={check_replicas}> compares replicated variables; "
            "add <variables=replicated>"
        )
    if profile_steps is not None and logdir is None:
        raise UsageError("<profile_steps> writes its trace to <logdir>; add <logdir=DIR>")
    check_local_sgd(reducer, check_replicas)
    if run and run.model.ema and check_replicas and reducer.method == "localsgd":
        raise UsageError(
            f"<check_replicas={check_replicas}> <ema={run.model.ema:g}>: under local SGD "
            "each copy averages its own weights, and those averages differ even where the "
            "copies agree; drop one of the two")
    outputs.check_file("metrics", metrics)
    outputs.check_file("placement_log", placement_log)
    outputs.check_directory("checkpoint_dir", checkpoint_dir)
    outputs.check_directory("logdir", logdir)
    batch = run.data.batch_size if run else 1
    if steps_per_epoch is None:  # a step takes `accumulate` batches per tower
        samples = batch * towers * (run.model.accumulate if run else 1)
        steps_per_epoch = (100 if info is None or info.train_size is None
                           else info.train_size // samples)
    if eval_steps is None:
        eval_steps = (data_lib.eval_batches(info.val_size, batch, towers)
                      if info is not None and info.val_size else 0)
    if keep_best is not None and record_name(keep_best).startswith("eval_") and (
            info is not None and not eval_steps):
        raise UsageError(f"<keep_best={keep_best}> is a held-out figure, and this run "
                         "evaluates on none; add held-out data or <eval_steps>, or keep the "
                         "best by <keep_best=loss>")
    top = re.search(r"top(\d+)_accuracy$", keep_best or "")
    k = run.model.metrics_top_k if run else None
    if top and k is not None and int(top.group(1)) != k:
        reported = f"top{k}_accuracy" if k else "no top-k accuracy"
        raise UsageError(f"<keep_best={keep_best}>: this run reports {reported}; add "
                         f"<metrics_top_k={top.group(1)}> or keep the best by another figure")
    picked = run.choices if run else ()
    schedule = getattr(run.model, "schedule", None) if run else None
    if hasattr(schedule, "check_length"):
        schedule.check_length(epochs)
    if steps_per_loop is None:
        choice = choices.steps_per_loop(gpus, every=(checkpoint_every, check_replicas))
        steps_per_loop = choice.value
        picked = (*picked, choice) if gpus else picked
    return TrainOptions(
        data=(dataclasses.replace(run.data, checkpointing=checkpoint_dir is not None)
              if run else None),
        model=run.model if run else None,
        reducer=reducer,
        loop=LoopOptions(epochs=epochs, steps_per_epoch=steps_per_epoch, eval_steps=eval_steps,
                         metrics_path=metrics, check_replicas=check_replicas,
                         steps_per_loop=steps_per_loop),
        placement=PlacementOptions(log_path=placement_log, strict=strict_placement,
                                   max_transfer_bytes=max_transfer_bytes),
        checkpoints=CheckpointOptions(
            directory=checkpoint_dir, every=checkpoint_every, keep=keep_checkpoints,
            resume=resume, io_device=cluster.local_cpu if cluster else None,
            keep_best=keep_best,
        ),
        skip_nonfinite=skip_nonfinite,
        logdir=logdir,
        profile_steps=None if profile_steps is None else tuple(profile_steps),
        choices=picked,
    )


def reducer_check(step, placement, compress: str | None) -> str:
    """Compares the step's reducer with the exact mean before the first step
    (engine.reducers.preflight); returns the line that says it passed."""
    from engine.reducers import preflight

    preflight.check_on_model(step.reducer, step.model, placement.devices,
                             step.variables.destinations, step.reducer_label, compress,
                             step.reducer_context)
    count = len(step.model.trainable_variables)
    return (f"reducer check passed: {step.reducer_label!r} gives the exact mean of "
            f"{count} gradient{'s' * (count != 1)} shaped as the model's, on "
            f"{len(placement.devices)} tower{'s' * (len(placement.devices) != 1)}, within "
            f"{compress or 'float32'} rounding")


def build(placement, options, info, watchdog=None, *, init_weights: str | None = None,
          check_reducer: bool = False, say=print):
    """The run built (engine.run.build.BuiltRun): under the watchdog's
    deadline with a cluster, then `init_weights` loaded into every model
    copy and, with `check_reducer`, the reducer compared with the exact
    mean; each says its line through `say`."""
    from engine.run import build as build_lib
    from engine.run import weights
    from engine.run.watchers import unguarded

    guard = watchdog.guard if watchdog else unguarded
    built = guard("building the towers", build_lib.build, placement, options.data,
                  options.model, options.reducer, info.val_size)
    if init_weights is not None:
        from engine.core import variables as variables_lib

        models = variables_lib.copies(built.step.variables, placement)
        count = weights.load_into(models, weights.saved_values(init_weights), init_weights,
                                  options.model.model_name)
        say(f"initial weights: {init_weights} ({count} variables)")
    if check_reducer:
        say(reducer_check(built.step, placement, options.reducer.compress))
    return built
