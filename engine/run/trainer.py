"""Builds the towers for a placement and trains them.

Everything here takes options objects built by the CLI; nothing reads flags
or the environment.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TextIO

import keras
import tensorflow as tf

from engine import reducers
from engine.core import loop, loss_scale, precision
from engine.core import variables as variables_lib
from engine.core.step import TowerStep
from engine.data import pipeline as data
from engine.placement import report as placement_report
from engine.placement.log import PlacementLog, RunInfo
from engine.run.checkpoint import (
    CheckpointError,
    CheckpointOptions,
    Checkpoints,
    replay,
    saveable_iterators,
)
from engine.run.guard import NonFiniteError, NonFiniteGuard
from engine.run.progress import EpochProgress
from engine.run.signals import GracefulStop, StopRequested
from engine.run.summaries import Summaries
from engine.run.watchdog import Watchdog
from engine.topology.devices import Placement
from towers import models

OPTIMIZERS = {
    "sgd": lambda lr: keras.optimizers.SGD(lr),
    "momentum": lambda lr: keras.optimizers.SGD(lr, momentum=0.9),
    "adam": lambda lr: keras.optimizers.Adam(lr),
    "rmsprop": lambda lr: keras.optimizers.RMSprop(lr),
}


# Learning rates tuned for a batch of 32, and how each optimizer scales with
# the global batch (sum over towers): adaptive optimizers by the square root
# of the batch ratio, plain SGD linearly (Goyal et al., 2017).
BASE_BATCH = 32
BASE_LEARNING_RATES = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3, "rmsprop": 1e-3}
LINEAR_SCALING = ("sgd", "momentum")


def default_learning_rate(optimizer: str, global_batch: int) -> tuple[float, str]:
    """The learning rate used when --lr is not given, and how it was derived."""
    base = BASE_LEARNING_RATES[optimizer]
    ratio = global_batch / BASE_BATCH
    if optimizer in LINEAR_SCALING:
        return base * ratio, f"{base:g} x {global_batch}/{BASE_BATCH}"
    return base * ratio**0.5, f"{base:g} x sqrt({global_batch}/{BASE_BATCH})"


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """What to train and how.

    Attributes:
      model: `mlp`, `lenet` or `package.module:function`.
      optimizer: one of OPTIMIZERS.
      learning_rate: the optimizer's learning rate.
      seed: seeds model initialisation and dropout (DALI gets its own seeds).
      learning_rate_note: how a default learning rate was derived, for the log.
      variables: `reduce-device` (one copy, on the reduce device) or
        `replicated` (a copy per tower, kept identical).
      compute_dtype: what the layers compute in: `float32`, or with
        --mixed-precision `bfloat16` (CPU towers) or `float16` (GPU towers,
        with dynamic loss scaling). Variables and the loss stay float32.
      xla: compile each tower's forward and backward pass with XLA.
    """

    model: str = "mlp"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    seed: int = 0
    learning_rate_note: str = ""
    variables: str = "reduce-device"
    compute_dtype: str = "float32"
    xla: bool = False

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"--optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}"
            )
        if not self.learning_rate > 0:
            raise ValueError(f"--lr ({self.learning_rate}) must be positive")
        if self.variables not in variables_lib.MODES:
            raise ValueError(
                f"--variables {self.variables!r} is not one of "
                f"{', '.join(variables_lib.MODES)}"
            )
        if self.compute_dtype not in precision.COMPUTE_DTYPES:
            raise ValueError(
                f"compute dtype {self.compute_dtype!r} is not one of "
                f"{', '.join(precision.COMPUTE_DTYPES)}"
            )
        if self.xla and self.variables == "reduce-device":
            raise ValueError(
                "--xla --variables reduce-device: an XLA cluster reads the variables "
                "on its tower's device, and TensorFlow cannot read variables on the "
                "reduce device from a tower on another; add --variables replicated"
            )


@dataclasses.dataclass(frozen=True)
class PlacementOptions:
    """What to record about placement.

    Attributes:
      log_path: JSON Lines file for the runtime placement of the first train
        and eval steps, or None.
      strict: stop after the first captured step if any tower op ran outside
        its tower's device.
    """

    log_path: str | None = None
    strict: bool = False

    @property
    def capture(self) -> bool:
        return self.log_path is not None or self.strict


@dataclasses.dataclass
class Towers:
    """A built run: the step functions and each tower's iterators."""

    step: TowerStep
    train_iterators: list
    held_out: loop.HeldOut | None


def build(
    placement: Placement,
    data_options: data.DataOptions,
    model_options: ModelOptions,
    reducer_options: reducers.ReducerOptions,
    val_size: int | None,
) -> Towers:
    """Creates the model(s) and optimizer(s) where the variable mode puts them,
    the reducer, and one DALI dataset per tower (and per split) on its device."""
    keras.utils.set_random_seed(model_options.seed)

    def make_model():
        with precision.policy(model_options.compute_dtype):
            return models.build(
                model_options.model, data_options.image_shape, data_options.num_classes
            )

    def make_optimizer():
        return OPTIMIZERS[model_options.optimizer](model_options.learning_rate)

    step = TowerStep(
        variables=variables_lib.make(
            model_options.variables, make_model, make_optimizer, placement,
            xla=model_options.xla,
        ),
        placement=placement,
        reducer=reducers.build(reducer_options, placement),
        loss_scale=(
            loss_scale.DynamicLossScale(placement.reduce_device)
            if precision.needs_loss_scaling(model_options.compute_dtype)
            else loss_scale.NoLossScale()
        ),
        xla=model_options.xla,
    )
    train_iterators = tower_iterators(data_options, placement, training=True)
    held_out = None
    if data_options.val_path and val_size:
        held_out = loop.HeldOut(
            tower_iterators(data_options, placement, training=False),
            size=val_size,
            batch_size=data_options.batch_size,
            num_towers=len(placement.towers),
        )
    return Towers(step, train_iterators, held_out)


def tower_iterators(
    data_options: data.DataOptions, placement: Placement, *, training: bool
) -> list:
    """One iterator per tower over its own DALI shard, created on its device."""
    iterators = []
    for tower in placement.towers:
        dataset = data.tower_dataset(data_options, tower, training=training)
        with tf.device(tower.device):
            iterators.append(iter(dataset))
    return iterators


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """Everything the CLI decided, in one place for `train`."""

    data: data.DataOptions
    model: ModelOptions
    reducer: reducers.ReducerOptions
    loop: loop.LoopOptions
    placement: PlacementOptions = PlacementOptions()
    checkpoints: CheckpointOptions = CheckpointOptions()
    skip_nonfinite: bool = False
    logdir: str | None = None
    profile_steps: tuple[int, int] | None = None

    def __post_init__(self):
        per_loop = self.loop.steps_per_loop
        if self.checkpoints.every % per_loop:
            raise ValueError(
                f"--checkpoint-every {self.checkpoints.every} is not a multiple of "
                f"--steps-per-loop {per_loop}; checkpoints are saved between loops"
            )


def describe(
    placement: Placement, options: TrainOptions, model: keras.Model, info: data.DatasetInfo
) -> str:
    """The layout, printed before training: who runs where and reads what."""
    n = len(placement.towers)
    batch = options.data.batch_size
    params, _ = count_parameters(model)
    lines = [
        f"tower-train: {n} tower{'s' * (n > 1)}, batch {batch} per "
        f"tower ({batch * n} per step), model {model.name} ({params:,} parameters)"
    ]
    for tower in placement.towers:
        on = "GPU" if tower.gpu_index is not None else "CPU"
        if info.train_size is None:
            source = f"synthetic images generated by DALI on {on}"
        else:
            start, end = data.shard_range(info.train_size, tower.index, n)
            decode = "GPU (mixed)" if on == "GPU" else on
            source = (
                f"shard {tower.index}/{n} of {info.format} {info.train_path} "
                f"({end - start} of {info.train_size}), decode on {decode}"
            )
        lines.append(f"  tower {tower.index}  {tower.device:<8} {source}")
    model_options, reducer = options.model, options.reducer
    note = model_options.learning_rate_note
    lr = f"lr {model_options.learning_rate:.4g}" + (f" ({note})" if note else "")
    how = "" if reducer.name == "central" else f"{reducer.name} "
    extras = [
        f"packed in {reducer.pack_bytes:,}-byte buffers" if reducer.pack_bytes else "",
        f"sent as {reducer.compress}" if reducer.compress else "",
    ]
    how_more = "".join(f", {e}" for e in extras if e)
    gradients = f"{how}mean of {n} gradient{'s' * (n > 1)}{how_more}"
    if model_options.variables == "replicated":
        lines.append(
            f"  replicas on every tower: variables and {model_options.optimizer} "
            f"update; {gradients}; {lr}; metrics on {placement.reduce_device}"
        )
    else:
        lines.append(
            f"  reduce   {placement.reduce_device:<8} variables, {gradients}, "
            f"{model_options.optimizer} update, {lr}"
        )
    if model_options.compute_dtype != "float32" or model_options.xla:
        lines.append(compute_line(model_options))
    return "\n".join(lines)


def compute_line(model_options: ModelOptions) -> str:
    """The header line for --mixed-precision and --xla: what the towers compute in."""
    dtype = model_options.compute_dtype
    what = dtype
    if dtype != "float32":
        scaling = (
            f"dynamic loss scaling from {loss_scale.INITIAL:g}"
            if precision.needs_loss_scaling(dtype)
            else "no loss scaling"
        )
        what = f"mixed {dtype} (variables and loss in float32), {scaling}"
    if model_options.xla:
        what += (", XLA: each tower's forward and backward, and each replica's update, "
                 "compiled on its device")
    return f"  compute  {what}"


def unguarded(what: str, function, *args):
    """Runs `function(*args)`: a guard without a deadline, where no watchdog is."""
    return function(*args)


class CheckpointWatcher:
    """Saves every `--checkpoint-every` steps and at the end of every epoch.

    A step that ends an epoch is saved after the epoch's evaluation, so the
    checkpoint holds the held-out position after it, not before.
    """

    def __init__(self, checkpoints: Checkpoints, steps_per_epoch: int, say, guard=None):
        self.checkpoints = checkpoints
        self.guard = guard or unguarded
        self.steps_per_epoch = steps_per_epoch
        self.say = say
        self.saved_at = -1

    def save(self, step: int) -> str:
        if step != self.saved_at:
            self.guard("saving a checkpoint", self.checkpoints.save, step)
            self.saved_at = step
        return self.checkpoints.latest

    def after_step(self, step: int, outputs: dict) -> None:
        if self.checkpoints.should_save(step) and step % self.steps_per_epoch:
            self.save(step)

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        self.say(f"checkpoint: {self.save(step)}")


class SignalWatcher:
    """Stops the run at the first safe point after a signal: after a step
    inside an epoch, or after an epoch's evaluation, metrics and checkpoint.
    A signal during the last epoch's end lets the finished run finish."""

    def __init__(self, stop: GracefulStop, options: loop.LoopOptions):
        self.stop = stop
        self.options = options

    def after_step(self, step: int, outputs: dict) -> None:
        if step % self.options.steps_per_epoch:
            self.stop.check(step)

    def after_epoch(self, epoch: int, step: int, record: dict) -> None:
        if epoch < self.options.epochs:
            self.stop.check(step)


def replay_gpu_readers(placement: Placement, towers: Towers, say, guard=None) -> str:
    """Puts the GPU towers' readers where the restored run left them, by
    reading and dropping the batches it had taken; returns what to add to
    the resume line.

    Every train step takes one batch per tower, so the run had taken
    `global_step` batches; a held-out pass is `eval_batches` batches and
    repeats, so only the position within it is replayed.
    """
    gpu = [t for t in placement.towers if t.gpu_index is not None]
    if not gpu:
        return ""
    devices = [t.device for t in gpu]
    steps = int(towers.step.global_step.numpy())
    splits = [(towers.train_iterators, steps)]
    held_out = towers.held_out
    if held_out is not None:
        per_pass = data.eval_batches(held_out.size, held_out.batch_size, held_out.num_towers)
        splits.append((held_out.iterators, int(held_out.position.numpy()) % per_pass))
    total = sum(batches for _, batches in splits)
    if total >= REPLAY_PROGRESS:
        say(f"replaying {total:,} batches on the GPU towers' readers to the saved position")
    before = 0
    for iterators, batches in splits:
        def progress(done: int, before: int = before) -> None:
            if total >= REPLAY_PROGRESS:
                say(f"  {before + done:,}/{total:,} batches")

        replay([iterators[t.index] for t in gpu], devices, batches, progress, guard=guard)
        before += batches
    names = ", ".join(str(t.index) for t in gpu)
    return (f"; GPU tower{'s' * (len(gpu) > 1)} {names} replayed {total:,} batches to "
            "that data position (DALI cannot save a GPU pipeline's position)")


# Replays shorter than this many batches take about a second; longer ones
# show progress.
REPLAY_PROGRESS = 2000


def run_signature(placement: Placement, options: TrainOptions) -> str:
    """What a checkpoint's data position and variables only fit: the towers,
    the batch, the data and the model."""
    return (
        f"towers {','.join(placement.devices)}, batch {options.data.batch_size}, "
        f"data {options.data.format}:{options.data.train_path}, model {options.model.model}, "
        f"variables {options.model.variables}"
    )


def count_parameters(model: keras.Model) -> tuple[int, int]:
    """(number, bytes) of the model's trainable parameters."""
    values = [v.numpy() for v in model.trainable_variables]
    return sum(int(v.size) for v in values), sum(int(v.nbytes) for v in values)


def run_info(placement: Placement, options: TrainOptions, model: keras.Model) -> RunInfo:
    parameters, parameter_bytes = count_parameters(model)
    return RunInfo(
        towers=placement.devices,
        reduce_device=placement.reduce_device,
        parameters=parameters,
        parameter_bytes=parameter_bytes,
        batch_size=options.data.batch_size,
        model=model.name,
        reducer=options.reducer.name,
        variables=options.model.variables,
        compress=options.reducer.compress,
    )


def train(
    placement: Placement,
    options: TrainOptions,
    info: data.DatasetInfo,
    stream: TextIO = sys.stdout,
    stop: GracefulStop | None = None,
    watchdog: Watchdog | None = None,
) -> list[dict]:
    """Builds the towers, restores a checkpoint if asked, and runs the loop;
    returns one record per epoch run.

    Raises:
      StopRequested: a signal stopped the run (after a checkpoint was saved).
      NonFiniteError: a loss or gradient was not finite (nothing saved).

    With a `watchdog`, every step, the building of the towers and every
    checkpoint save and restore run under its deadline.
    """
    # Work that talks to other tasks runs under the watchdog's deadline.
    guard = watchdog.guard if watchdog else unguarded
    towers = guard(
        "building the towers", build,
        placement, options.data, options.model, options.reducer, info.val_size,
    )
    model = towers.step.model
    print(describe(placement, options, model, info), file=stream, flush=True)

    def say(message: str) -> None:
        print(message, file=stream, flush=True)

    watchers = [NonFiniteGuard(placement.devices, skip=options.skip_nonfinite, say=say)]
    saver = None
    if options.checkpoints.directory:
        signature = run_signature(placement, options)
        run = tf.Variable(signature, trainable=False)
        state = {**towers.step.trackables(), "run": run,
                 "train_data": saveable_iterators(placement.towers, towers.train_iterators)}
        if towers.held_out is not None:
            state["held_out"] = [
                *saveable_iterators(placement.towers, towers.held_out.iterators),
                towers.held_out.position,
            ]
        checkpoints = Checkpoints(options.checkpoints, state, warn=lambda m: say(f"warning: {m}"))
        if options.checkpoints.resume:
            path = guard("restoring a checkpoint", checkpoints.restore)
            saved = run.numpy().decode()
            if path and saved != signature:
                raise CheckpointError(
                    f"--resume: {path} was written by a run with {saved}; this run has "
                    f"{signature}; resume with the same --devices, --batch-size, --data "
                    "and --model"
                )
            if path:
                say(f"resumed from {path} at step {int(towers.step.global_step.numpy())}"
                    + replay_gpu_readers(placement, towers, say, guard))
            else:
                say(f"--resume: no checkpoint in {options.checkpoints.directory} yet; "
                    "starting from the beginning")
        saver = CheckpointWatcher(checkpoints, options.loop.steps_per_epoch, say, guard)
        watchers.append(saver)
    summaries = None
    if options.logdir:
        summaries = Summaries(
            options.logdir, options.profile_steps, int(towers.step.global_step.numpy()),
            options.loop.steps_per_loop,
        )
        watchers.append(summaries)
    if stop is not None:
        watchers.append(SignalWatcher(stop, options.loop))

    log = None
    call = loop.plain_call
    if options.placement.capture:
        log = PlacementLog(
            options.placement.log_path,
            run_info(placement, options, model),
            strict=options.placement.strict,
        )
        call = log.call
    if watchdog is not None:
        call = watchdog.wrap_call(call)
    try:
        history = loop.run(
            towers.step,
            towers.train_iterators,
            towers.held_out,
            options.loop,
            EpochProgress(stream),
            call,
            watchers,
        )
    except StopRequested as stopped:
        stopped.checkpoint = saver.save(stopped.step) if saver else None
        raise
    except NonFiniteError as err:
        err.checkpoint = saver.checkpoints.latest if saver else None
        raise
    finally:
        if summaries:
            summaries.close()
    if options.placement.log_path:
        print(placement_report.summary(log.entries), file=stream)
        print(f"placement log: {options.placement.log_path}", file=stream, flush=True)
    return history
