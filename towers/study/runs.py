"""One run of a study: what it measured, read back from its folder (the
placement log's bytes, the metrics' epochs, TensorBoard's step losses), and
its `run.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics

__all__ = ["Run", "load", "measure"]

# Exact means in one op each (NCCL, TensorFlow's collectives): their bytes
# are not _Send/_Recv pairs, so they count as a dense ring's.
OPAQUE = ("collective", "nccl")


@dataclasses.dataclass(frozen=True)
class Run:
    """One reducer trained with one seed.

    Attributes:
      reducer: the reducer's label (its spec, or your function's name).
      seed: the run's seed.
      epochs: the metrics record of every epoch (`loss`, `eval_accuracy`, ...).
      step_losses: the training loss of every step, in order.
      bytes_per_step: bytes the first train step moved between devices (the
        placement log's figure).
      declared_bytes: bytes the reducer says a step sends, or None.
      mean_bytes_per_step: bytes per step averaged over steps (local SGD
        sends only on its averaging steps).
      bytes_ratio: `mean_bytes_per_step` over a dense ring all-reduce's bytes
        on the same towers.
      step_seconds: a step's time here (median over the epochs after the
        first, which traces the step).
      state_bytes: the reducer's own state (residuals, factors), in bytes.
      figures: what the predictions start from (`towers.study.predict`).
      predictions: scale label -> what `towers.study.predict` gives, for
        the study's scales.
    """

    reducer: str
    seed: int
    epochs: list[dict]
    step_losses: list[float]
    bytes_per_step: int
    declared_bytes: int | None
    mean_bytes_per_step: float
    bytes_ratio: float
    step_seconds: float
    state_bytes: int
    figures: dict
    predictions: dict[str, dict] = dataclasses.field(default_factory=dict)


def _epochs(metrics: str) -> list[dict]:
    """Every epoch's record, the last written where a resumed run wrote one twice."""
    if not os.path.exists(metrics):
        return []
    with open(metrics) as stream:
        records = {r["epoch"]: r for r in map(json.loads, filter(str.strip, stream))}
    return [records[k] for k in sorted(records)]


def _step_losses(logdir: str) -> list[float]:
    """`train/loss` of every step from the run's TensorBoard events (a step
    trained again after a resume counts once, as its last value)."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    losses = {}
    for name in sorted(os.listdir(logdir)):
        if not name.startswith("events."):
            continue
        for record in tf.data.TFRecordDataset(os.path.join(logdir, name)):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.tag == "train/loss":
                    losses[event.step] = float(tf.make_ndarray(value.tensor))
    return [losses[step] for step in sorted(losses)]


def _state_bytes(trainer) -> int:
    from engine.reducers.stateful import stateful_part

    state = stateful_part(trainer.built.step.reducer) if trainer.built else None
    if state is None:
        return 0
    return sum(v.shape.num_elements() * v.dtype.size for v in state.variables)


def measure(trainer, options, seed: int, folder: str) -> Run:
    """The Run that `trainer` made with reducer `options` and `seed`, from what
    it wrote in `folder`: bytes from the placement log, epochs from the
    metrics, every step's loss from TensorBoard."""
    from engine.placement import report

    entries = report.load(os.path.join(folder, "placement.jsonl"))
    info = report.run_info(entries)
    measured = sum(report.matrix(entries, "train").values())
    mean = float(measured)
    if options.builtin in OPAQUE:
        mean = float(report.dense_ring_bytes(info))
    if options.method == "localsgd":  # it sends only every `every` steps
        from engine.reducers import parameters

        every = (options.arguments.get("every", parameters("localsgd")["every"])
                 if options.builtin else options.function.every)
        mean = measured / every
    epochs = _epochs(os.path.join(folder, "metrics.jsonl"))
    times = [r["seconds"] / r["steps"] for r in epochs]
    figures = {"method": options.method, "parameter_bytes": info["parameter_bytes"],
               "towers": len(info["towers"]),
               "bytes_ratio": mean / report.dense_ring_bytes(info),
               "step_seconds": statistics.median(times[1:] or times),
               "steps_per_epoch": epochs[-1]["steps"],
               "simulated": max([count for _, count in trainer.placement.simulated()],
                                default=1)}
    return Run(reducer=options.label, seed=seed, epochs=epochs,
               step_losses=_step_losses(os.path.join(folder, "tensorboard")),
               bytes_per_step=measured,
               declared_bytes=report.reduction_bytes(info), mean_bytes_per_step=mean,
               bytes_ratio=figures["bytes_ratio"], step_seconds=figures["step_seconds"],
               state_bytes=_state_bytes(trainer), figures=figures)


def load(path: str) -> Run:
    """A finished run from its `run.json`."""
    with open(path) as stream:
        fields = json.load(stream)
    fields.pop("predictions", None)  # made again for this study's scales
    return Run(**fields)
