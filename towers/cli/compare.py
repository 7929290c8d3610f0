"""tower-compare: one workload trained once per reducer and seed; accuracy
against bytes and predicted time (towers.compare)."""

from __future__ import annotations

import os

import click

from engine.errors import TowerError
from towers.cli import common, train_flags
from towers.cli.train import data_source

__all__ = ["tower_compare", "main"]

# The named studies (towers.study.papers), without importing TensorFlow.
STUDY_NAMES = ("papers-lenet", "papers-resnet20", "papers-transformer")
# The flags that say which data a workload reads (towers.cli.train.data_source).
DATA_FLAGS = ("data_path", "data_format", "seq_len", "data_pipeline", "synthetic_samples",
              "num_classes")
# tower-train's flags that define the workload, as it defines them.
WORKLOAD = ("devices", "gpu_memory", "reduce_device", "data_path", "data_format", "seq_len",
            "image_size", "num_classes", "synthetic_samples", "augment", "data_pipeline",
            "dali_threads", "prefetch", "model", "from_logits", "optimizer",
            "learning_rate", "batch_size", "steps_per_epoch", "eval_steps", "variables",
            "mixed_precision")


def _workload_options() -> list[click.Parameter]:
    def command():
        pass

    params = {p.name: p for p in train_flags.options(command).__click_params__}
    chosen = [params[name] for name in WORKLOAD]
    variables = next(p for p in chosen if p.name == "variables")
    variables.default = "replicated"  # every reducer, local SGD too, takes it
    return chosen


def _given(name: str) -> bool:
    """Whether the command line gave the flag of parameter `name`."""
    source = click.get_current_context().get_parameter_source(name)
    return source == click.core.ParameterSource.COMMANDLINE


def _named(study: str, flags: dict, reducers, seeds, topologies, epochs) -> dict:
    """towers.compare's arguments for `--study`: the named study's, but for
    the flags the command line gave."""
    from towers.study import papers

    arguments = papers.STUDIES[study].arguments()
    given = {name: value for name, value in flags.items() if _given(name)}
    data_flags = [name for name in DATA_FLAGS if given.pop(name, None) is not None]
    if data_flags:  # the data the command line names, in place of the study's
        given["data"] = data_source(flags)
    arguments.update(given)
    for name, value in (("reducers", list(reducers)), ("seeds", seeds),
                        ("topologies", list(topologies)), ("epochs", epochs)):
        if _given(name):
            arguments[name] = value
    return arguments


def _run(reducers, study, seeds, topologies, target_accuracy, out, epochs, **flags):
    """Train the workload once per --reducer and seed, and compare the runs."""
    import towers

    if not reducers and study is None:
        common.fail("tower-compare", "give --reducer once per reducer to compare, or "
                    f"--study with one of {', '.join(STUDY_NAMES)}", 2)
    try:
        flags["mixed_precision"] = {None: False, "auto": True}.get(
            flags["mixed_precision"], flags["mixed_precision"])
        if study is not None:
            arguments = _named(study, flags, reducers, seeds, topologies, epochs)
        else:
            flags["data"] = data_source(flags)
            arguments = dict(reducers=list(reducers), seeds=seeds, topologies=list(topologies),
                             epochs=epochs, steps_per_epoch=flags.pop("steps_per_epoch"),
                             eval_steps=flags.pop("eval_steps"), **flags)
        study = towers.compare(out=out, target_accuracy=target_accuracy, **arguments)
    except TowerError as err:
        common.fail("tower-compare", err.render(FLAGS),
                    1 if isinstance(err, towers.RunError) else 2)
    click.echo(study.table())
    written = [os.path.join(out, name)
               for name in ("study.json", "table.txt", "study.png", "pareto.png")]
    click.echo(f"tower-compare: wrote {', '.join(written)}")


tower_compare = common.OneLineCommand(
    name="tower-compare",
    callback=_run,
    help="Train one workload once per --reducer and seed (same weights, same batches) "
         "and compare them: held-out accuracy against epochs, bytes sent and the time "
         "the cost model predicts on each --topology.",
    params=[
        click.Option(["--reducer", "reducers"], multiple=True, metavar="SPEC",
                     help="A reducer to compare; give it once per reducer: central, ring, "
                          "powersgd:rank=2, topk:ratio=0.01, signsgd, localsgd:every=8, or "
                          "package.module:function. The first exact one (central, ring, "
                          "tree, ...) is the baseline; central is added when none is."),
        click.Option(["--study"], type=click.Choice(STUDY_NAMES), default=None,
                     help="A named study: its methods, workload, seeds, epochs and "
                          "topologies, for the flags not given. papers-*: the compression "
                          "papers' methods on 16 workers (docs: The compression papers)."),
        click.Option(["--seeds"], default=1, show_default=True, type=int,
                     help="Each reducer runs with seeds 0 to N-1."),
        click.Option(["--topology", "topologies"], multiple=True, metavar="NAME:TOWERS",
                     help="A machine to predict time on, at a tower count, with an "
                          "optional compute time per step in ms: 2x8-ethernet-100g:16, "
                          "dgx1-v100:8:35. Give it once per machine."),
        click.Option(["--target-accuracy"], type=float, default=None,
                     help="The held-out accuracy 'time to target' times. Default: 99% of "
                          "the baseline's final accuracy."),
        click.Option(["--out"], required=True,
                     help="Folder for study.json, table.txt, study.png and every run's "
                          "files; given again with the same workload, finished runs are "
                          "kept and an unfinished one resumes."),
        click.Option(["--epochs"], default=3, show_default=True, type=int,
                     help="Epochs each reducer's run trains (every run the same)."),
        *_workload_options(),
    ],
)
FLAGS = common.flags_of(tower_compare, reducer="--reducer", topology="--topology")


def main():
    tower_compare.main(prog_name="tower-compare")


if __name__ == "__main__":
    main()
