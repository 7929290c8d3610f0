"""A study: one workload trained once per reducer and seed, and what each run
cost in accuracy, bytes and (predicted) time.

Every run is a Trainer with the same arguments but its reducer and its seed,
with TensorFlow's op determinism on: for one seed, every reducer starts from
the same weights and reads the same batches, and the exact-mean run is the
plain run of that workload, bit for bit. Runs keep everything under
`out/runs/REDUCER/seedK/`: the metrics, the placement log, the loss of every
step (TensorBoard events), checkpoints and,
once finished, `run.json`. A study started again with the same `out` keeps
the finished runs and resumes an unfinished one from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from engine.errors import UsageError
from towers.study import runs as runs_lib
from towers.study.runs import Run
from towers.study.scales import Scale

__all__ = ["Method", "Run", "Study", "compare"]

# Built-ins that give the exact mean with traffic the placement log sees: a
# study's baseline is the first of them it lists (uncompressed), else
# `central`, added in front.
EXACT = ("central", "ring", "tree", "hierarchical")


@dataclasses.dataclass(frozen=True)
class Method:
    """A reducer as a study lists it: with its own name in the table, and the
    Trainer arguments it trains with where they differ from the study's.

        Method("topk:ratio=0.001,momentum=0.9", label="DGC 0.1%",
               trainer={"optimizer": "sgd"})  # the momentum is the reducer's

    Attributes:
      reducer: what `reducer=` takes: a spec, `package.module:function`, a
        function or a StatefulReducer.
      label: the name in the table, chart and folders; empty: the reducer's.
      trainer: Trainer arguments of this method's runs over the study's
        (`optimizer`, `learning_rate`, ...); not `seed`, `deterministic`,
        `reducer` or `devices`.
    """

    reducer: str | Callable
    label: str = ""
    trainer: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        own = sorted(set(self.trainer) & {"seed", "deterministic", "reducer", "devices"})
        if own:
            raise UsageError(f"<reducers> {self.label or self.reducer!r}: {', '.join(own)} "
                             "are the study's to set, the same for every method")


@dataclasses.dataclass(frozen=True)
class Study:
    """What `compare` returns: every run, and how to read them together.

    Attributes:
      reducers: the reducers' labels, the exact-mean baseline first.
      seeds: the seeds every reducer ran with.
      scales: the machines predicted for.
      target_accuracy: the held-out accuracy "time to target" is timed to.
      runs: every run, by seed, then reducer.
      out: the folder with everything written.
      held_out: what the held-out figure is: `accuracy`, or `perplexity`
        (exp of the held-out loss) for text, where accuracy is shown too.
    """

    reducers: list[str]
    seeds: list[int]
    scales: list[Scale]
    target_accuracy: float
    runs: list[Run]
    out: str
    held_out: str = "accuracy"

    def rows(self) -> list[dict]:
        """One summary per reducer, over its seeds (see towers.study.report)."""
        from towers.study import report

        return report.rows(self)

    def table(self) -> str:
        """The summary as text: accuracy and bytes, then time per scale."""
        from towers.study import report

        return report.table(self)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=,-]+", "_", label)


def _distinct(options: list) -> list:
    """Reducer objects or functions that share a label (two objects of one
    class) get their own: their repr where it tells them apart
    (`TopK(ratio=0.1)`), else the label and a number (`TopK #2`). The same
    spec twice stays a mistake to refuse."""
    labels = [o.label for o in options]
    shared = {x for x in labels if labels.count(x) > 1}
    group = {x: [o for o in options if o.label == x and not isinstance(o.name, str)]
             for x in shared}
    named = []
    for option in options:
        own = group.get(option.label, [])
        place = next((k for k, o in enumerate(own) if o is option), None)
        if place is None or len(own) < 2:
            named.append(option)
            continue
        reprs = [repr(o.name) for o in own]
        display = (repr(option.name) if len(set(reprs)) == len(reprs)
                   and all(len(r) <= 60 and " object at 0x" not in r for r in reprs)
                   else f"{option.label} #{place + 1}")
        named.append(dataclasses.replace(option, display=display))
    return named


def _check_reducers(reducers: Sequence[str | Callable | Method]) -> tuple[list, dict]:
    """The reducers' options, the exact-mean baseline first, and each one's
    Trainer arguments by label; every bad spec named in one UsageError
    before anything runs."""
    from engine.reducers.options import ReducerOptions

    if isinstance(reducers, str) or not reducers:
        raise UsageError("<reducers> must be a list of one reducer or more, e.g. "
                         "['central', 'powersgd:rank=2']")
    options, trainers, bad = [], [], []
    for spec in reducers:
        method = spec if isinstance(spec, Method) else Method(spec)
        try:
            options.append(ReducerOptions(name=method.reducer, display=method.label))
            trainers.append(dict(method.trainer))
        except UsageError as err:
            bad.append(err.message)
    if bad:
        raise UsageError("; ".join(bad))
    options = _distinct(options)  # in the order given
    overrides = {o.label: given for o, given in zip(options, trainers)}
    labels = [o.label for o in options]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise UsageError(f"<reducers> lists {', '.join(map(repr, repeated))} more than once")
    exact = next((o for o in options if o.builtin in EXACT and not o.compress), None)
    if exact is None:
        exact = ReducerOptions(name="central")
        options.insert(0, exact)
        overrides[exact.label] = {}
    else:
        options.remove(exact)
        options.insert(0, exact)
    return options, overrides


def _stable(value) -> object:
    """A value as the same text in every process: a function by its
    module and name, never by its address."""
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}:{value.__qualname__}"
    return re.sub(r" at 0x[0-9a-f]+", "", repr(value))


def _signature(trainer: dict, epochs: int, steps_per_epoch, eval_steps) -> dict:
    workload = {k: _stable(v) for k, v in sorted(trainer.items())}
    return {"trainer": workload, "epochs": epochs, "steps_per_epoch": steps_per_epoch,
            "eval_steps": eval_steps}


def _check_out(out: str, signature: dict) -> None:
    """Refuses a folder holding a study of another workload (its runs would
    be mixed with these)."""
    from engine.run import outputs

    outputs.check_directory("out", out)
    path = os.path.join(out, "workload.json")
    if os.path.exists(path):
        with open(path) as stream:
            before = json.load(stream)
        if before != signature:
            changed = sorted(k for k in {**before["trainer"], **signature["trainer"]}
                             if before["trainer"].get(k) != signature["trainer"].get(k))
            changed += [k for k in ("epochs", "steps_per_epoch", "eval_steps", "methods")
                        if before.get(k) != signature.get(k)]
            raise UsageError(
                f"<out> {out!r} holds a study of another workload ({', '.join(changed)} "
                "differ); give another <out>, or the same workload to continue it"
            )


def _write_workload(out: str, signature: dict) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "workload.json"), "w") as stream:
        json.dump(signature, stream, indent=1)


def compare(
    reducers: Sequence[str | Callable | Method],
    *,
    out: str,
    seeds: int = 1,
    topologies: Sequence[str | Scale] = (),
    target_accuracy: float | None = None,
    epochs: int = 3,
    steps_per_epoch: int | None = None,
    eval_steps: int | None = None,
    verbose: int = 1,
    stream: TextIO | None = None,
    **trainer: object,
) -> Study:
    """Trains one workload once per reducer and seed, and compares them.

        study = towers.compare(["central", "powersgd:rank=2", "topk"], out="study",
                               devices="cpu:2", model="lenet", epochs=3,
                               topologies=["2x8-ethernet-100g:16"])
        print(study.table())

    Args:
      reducers: built-in names, specs with parameters (`powersgd:rank=2`),
        `package.module:function`, your functions, or `Method`s (a reducer
        with its own label and Trainer arguments). The first exact one
        (central, ring, tree, ...) is the baseline; `central` is added in
        front when none is listed.
      out: the folder for everything: `study.json`, `table.txt`,
        `study.png`, and each run's files under `runs/`. Given again with the
        same workload, finished runs are kept and an unfinished one resumes.
      seeds: each reducer runs with seeds 0 to seeds - 1.
      topologies: machines to predict time on: `NAME:TOWERS[:COMPUTE_MS]`
        strings (`2x8-ethernet-100g:16`) or `towers.study.Scale`s.
      target_accuracy: the held-out accuracy that "time to target" times;
        default: 99% of the baseline's final accuracy (mean over seeds).
      epochs: epochs per run.
      steps_per_epoch: default: one pass over the training data.
      eval_steps: held-out batches per tower after each epoch; default: all.
      verbose: 0 silent, 1 a line per run and epoch.
      stream: where those lines go (stdout).
      **trainer: the workload, as `towers.Trainer` takes it (`devices`,
        `model`, `data`, `batch_size`, `optimizer`, `learning_rate`,
        `variables`, ...); `variables` defaults to `"replicated"`, which
        every reducer takes. `seed` and `deterministic` are the study's.

    Returns:
      The Study, also written to `out`.

    Raises:
      UsageError: a bad argument, every bad reducer named, before any run.
    """
    from towers import Trainer
    from towers.study import report

    stream = stream or sys.stdout
    for own in ("seed", "deterministic", "reducer"):
        if own in trainer:
            raise UsageError(f"<{own}> is the study's to set; give <seeds> and <reducers>")
    if seeds < 1:
        raise UsageError(f"<seeds> ({seeds}) must be at least 1")
    if eval_steps == 0:
        raise UsageError("<eval_steps> (0): a study compares held-out accuracy; give "
                         "eval_steps of 1 or more, or leave it out for the whole set")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise UsageError(f"<target_accuracy> ({target_accuracy}) must be in (0, 1]")
    options, overrides = _check_reducers(reducers)
    scales = [Scale.parse(s) for s in topologies]
    trainer.setdefault("variables", "replicated")
    signature = _signature(trainer, epochs, steps_per_epoch, eval_steps)
    methods = {label: {k: _stable(v) for k, v in sorted(given.items())}
               for label, given in overrides.items() if given}
    if methods:  # a study without them keeps the signature it had
        signature["methods"] = methods
    _check_out(out, signature)
    # Every run's Trainer is made now: a workload or pairing that cannot work
    # is refused before the first run trains.
    def make(seed, option):
        return Trainer(reducer=option.name, seed=seed, deterministic=True, stream=stream,
                       **{**trainer, **overrides[option.label]})

    first = make(0, options[0])
    info = first.info
    if not info.val_size:  # refused at the first: an accuracy of 0 would be charted
        where = info.train_path or f"{info.format} data"
        raise UsageError(
            f"<data>: {where} has no held-out split, and a study compares held-out "
            "accuracy; give data with one (a val/ folder beside train/, or MNIST)")
    plan = [(seed, o, first if (seed, k) == (0, 0) else make(seed, o))
            for seed in range(seeds) for k, o in enumerate(options)]
    towers_here = len(plan[0][2].placement.towers)
    if towers_here < 2:
        raise UsageError(f"<devices>: a study compares reductions between towers, and "
                         f"{towers_here} tower has none; give 2 or more")
    labels = [s.label for s in scales]
    if len(set(labels)) < len(labels):
        raise UsageError(f"<topologies> lists a machine more than once: {', '.join(labels)}")
    _write_workload(out, signature)

    def say(line: str) -> None:
        if verbose:
            print(line, file=stream, flush=True)

    runs = []
    for k, (seed, o, run_trainer) in enumerate(plan, 1):
        folder = os.path.join(out, "runs", _slug(o.label), f"seed{seed}")
        done = os.path.join(folder, "run.json")
        what = f"run {k}/{len(plan)}: {o.label}, seed {seed}"
        if os.path.exists(done):
            say(f"{what}: finished before, kept")
            runs.append(runs_lib.load(done))
            continue
        os.makedirs(folder, exist_ok=True)
        checkpoints = os.path.join(folder, "checkpoints")
        resume = os.path.exists(os.path.join(checkpoints, "checkpoint"))
        log = os.path.join(folder, "placement.jsonl")
        say(f"{what}: {'resumed from its checkpoint' if resume else 'training'}")
        run_trainer.fit(
            epochs, steps_per_epoch, eval_steps=eval_steps, verbose=0,
            metrics=os.path.join(folder, "metrics.jsonl"), checkpoint_dir=checkpoints,
            resume=resume, placement_log=None if os.path.exists(log) else log,
            logdir=os.path.join(folder, "tensorboard"),
            callbacks=[report.EpochLine(say, epochs)])
        run = runs_lib.measure(run_trainer, o, seed, folder)
        with open(done + ".partial", "w") as handle:
            json.dump(dataclasses.asdict(run), handle)
        os.replace(done + ".partial", done)  # a run is finished once this exists
        runs.append(run)

    from towers.study.predict import predict

    runs = [dataclasses.replace(run, predictions={s.label: predict(run.figures, s)
                                                  for s in scales}) for run in runs]
    study = Study(reducers=[o.label for o in options], seeds=list(range(seeds)),
                  scales=scales, target_accuracy=0.0, runs=runs, out=out,
                  held_out="perplexity" if info.format == "text" else "accuracy")
    target = target_accuracy or report.default_target(study)
    study = dataclasses.replace(study, target_accuracy=target)
    report.write(study)
    return study
