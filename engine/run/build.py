"""What a run is made of: the models and optimizers where the variable mode
puts them, the reducer, the step, and one DALI iterator per tower and split.

Everything here takes option objects; nothing reads flags or the environment.
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from engine import data, reducers
from engine.core import loop, loss_scale, precision, schedules
from engine.core import variables as variables_lib
from engine.core.losses import per_sample
from engine.core.options import ModelOptions
from engine.core.step import TowerStep
from engine.errors import UsageError
from engine.topology.devices import Placement

__all__ = ["BuiltRun", "build", "check_outputs", "tower_iterators"]


@dataclasses.dataclass
class BuiltRun:
    """A built run: the step functions and each tower's iterators."""

    step: TowerStep
    train_iterators: list
    held_out: loop.HeldOut | None
    learning_rates: schedules.LearningRates | None = None


def build(
    placement: Placement,
    data_options: data.DataOptions,
    model_options: ModelOptions,
    reducer_options: reducers.ReducerOptions,
    val_size: int | None,
) -> BuiltRun:
    """Creates the model(s) and optimizer(s) where the variable mode puts them,
    the reducer, and one DALI dataset per tower (and per split) on its device."""
    keras.utils.set_random_seed(model_options.seed)

    def make_model():
        with precision.policy(model_options.compute_dtype):
            return model_options.model(
                input_shape=data.sample_shape(data_options),
                num_classes=data_options.num_classes,
            )

    make_optimizer, rates = model_options.make_optimizer, None
    if isinstance(model_options.schedule, schedules.Schedule):
        if not model_options.schedule.plain:
            rates = schedules.LearningRates(model_options.learning_rate, model_options.schedule)
            make_optimizer = lambda: model_options.make_optimizer(rates.new())  # noqa: E731
    else:  # the user's own: a Keras LearningRateSchedule or a function of the step
        own = schedules.from_function(model_options.schedule)
        make_optimizer = lambda: model_options.make_optimizer(own)  # noqa: E731
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
        loss=per_sample(model_options.loss, model_options.from_logits,
                        model_options.label_smoothing),
        reducer_label=reducer_options.label,
        **model_options.step_settings(data_options.num_classes),
    )
    check_outputs(step.model, data_options, model_options, step.variables.destinations[0])
    train_iterators = tower_iterators(data_options, placement, training=True)
    held_out = None
    if data_options.val_path and val_size:
        held_out = loop.HeldOut(
            tower_iterators(data_options, placement, training=False),
            size=val_size,
            batch_size=data_options.batch_size,
            num_towers=len(placement.towers),
        )
    return BuiltRun(step, train_iterators, held_out, rates)


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


def check_outputs(model: keras.Model, data_options: data.DataOptions,
                  model_options: ModelOptions, device: str) -> None:
    """Runs the model once on two plain samples, on `device`, before any
    step: a model that cannot take the data's samples, that gives outputs of
    another shape than the labels need, or that gives something other than
    probabilities to the default loss (which takes softmax outputs) is
    refused in one line, instead of failing or training wrongly later.

    Raises:
      UsageError: naming the model, what it gave and what would fit.
    """
    name = model_options.model_name
    shape = data.sample_shape(data_options)
    text = data_options.format == "text"
    dtype = tf.int32 if text else tf.float32
    classes = data_options.num_classes
    wanted = (2, *shape[:1], classes) if text else (2, classes)
    what = (f"sequences of {shape[0]} bytes" if text else
            f"{'x'.join(str(d) for d in shape)} images")
    try:
        with tf.device(device):
            # Mid-grey images (or byte 0): not all zeros, which would give a
            # model without a softmax outputs of exactly zero.
            blank = tf.zeros((2, *shape), dtype) if text else tf.fill((2, *shape), 0.5)
            outputs = tf.cast(model(blank, training=False), tf.float32)
    except Exception as err:  # Keras and TensorFlow raise many kinds for a bad shape
        first = next((line.strip() for line in str(err).splitlines() if line.strip()),
                     type(err).__name__)
        raise UsageError(f"<model={name}> cannot take {what}: {first[:200]}") from None
    if tuple(outputs.shape) != wanted:
        raise UsageError(
            f"<model={name}> gives outputs of shape {tuple(outputs.shape)} for 2 {what}; "
            f"the labels need {wanted}: one output per class"
            + (" at every position" if text else "")
        )
    if model_options.loss is not None or model_options.from_logits:
        return
    values = outputs.numpy()
    sums = values.sum(axis=-1)
    if values.min() < -1e-3 or abs(sums - 1.0).max() > 1e-2:
        raise UsageError(
            f"<model={name}> gives outputs that are not probabilities (a row sums to "
            f"{float(sums.flat[abs(sums - 1.0).argmax()]):.3g}, the smallest is "
            f"{float(values.min()):.3g}), and the default loss takes softmax outputs; "
            "if they are logits, add <from_logits=True>"
        )
