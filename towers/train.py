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

from engine import data, loop, placement_report
from engine.devices import Placement
from engine.placement import PlacementLog, RunInfo
from engine.progress import EpochProgress
from engine.reduce import CentralMean
from engine.step import TowerStep
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
    """

    model: str = "mlp"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    seed: int = 0
    learning_rate_note: str = ""

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"--optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}"
            )
        if not self.learning_rate > 0:
            raise ValueError(f"--lr ({self.learning_rate}) must be positive")


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
    val_size: int | None,
) -> Towers:
    """Creates the model and optimizer on the reduce device and one DALI
    dataset per tower (and per split) on the tower's device."""
    keras.utils.set_random_seed(model_options.seed)
    with tf.device(placement.reduce_device):
        model = models.build(
            model_options.model, data_options.image_shape, data_options.num_classes
        )
        optimizer = OPTIMIZERS[model_options.optimizer](model_options.learning_rate)
    step = TowerStep(
        model=model,
        optimizer=optimizer,
        placement=placement,
        reducer=CentralMean(placement.reduce_device),
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


def describe(
    placement: Placement,
    data_options: data.DataOptions,
    model: keras.Model,
    model_options: ModelOptions,
    info: data.DatasetInfo,
) -> str:
    """The layout, printed before training: who runs where and reads what."""
    n = len(placement.towers)
    params = sum(int(v.numpy().size) for v in model.trainable_variables)
    lines = [
        f"tower-train: {n} tower{'s' * (n > 1)}, batch {data_options.batch_size} per "
        f"tower ({data_options.batch_size * n} per step), model {model.name} "
        f"({params:,} parameters)"
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
    note = model_options.learning_rate_note
    lines.append(
        f"  reduce   {placement.reduce_device:<8} variables, mean of {n} "
        f"gradient{'s' * (n > 1)}, {model_options.optimizer} update, "
        f"lr {model_options.learning_rate:.4g}" + (f" ({note})" if note else "")
    )
    return "\n".join(lines)


def train(
    placement: Placement,
    data_options: data.DataOptions,
    model_options: ModelOptions,
    loop_options: loop.LoopOptions,
    info: data.DatasetInfo,
    placement_options: PlacementOptions = PlacementOptions(),
    stream: TextIO = sys.stdout,
) -> list[dict]:
    """Builds the towers and runs the loop; returns one record per epoch."""
    towers = build(placement, data_options, model_options, info.val_size)
    model = towers.step.model
    print(
        describe(placement, data_options, model, model_options, info),
        file=stream,
        flush=True,
    )
    log = None
    call = loop.plain_call
    if placement_options.capture:
        variables = model.trainable_variables
        run_info = RunInfo(
            towers=placement.devices,
            reduce_device=placement.reduce_device,
            parameters=sum(int(v.numpy().size) for v in variables),
            parameter_bytes=sum(int(v.numpy().nbytes) for v in variables),
            batch_size=data_options.batch_size,
            model=model.name,
        )
        log = PlacementLog(
            placement_options.log_path, run_info, strict=placement_options.strict
        )
        call = log.call
    history = loop.run(
        towers.step,
        towers.train_iterators,
        towers.held_out,
        loop_options,
        EpochProgress(stream),
        call,
    )
    if placement_options.log_path:
        print(placement_report.summary(log.entries), file=stream)
        print(f"placement log: {placement_options.log_path}", file=stream, flush=True)
    return history
