"""`tower-train`: flags into a `towers.Trainer`, its `fit`, and one-line errors.

Everything that can be checked without TensorFlow is checked before it is
imported, so bad input fails in well under a second. Every error is one line on
stderr, `tower-train: error: ...`, with exit code 2 for bad input and 1 for a
failure during training. The library names its arguments in Python terms; the
errors here name the flags (`FLAGS`).
"""

from __future__ import annotations

import os
import shlex
import sys

import click

from engine.core.progress import Voice
from engine.errors import RunError, TowerError
from towers.cli import common, op_errors
from towers.cli.common import GroupedCommand, UsageFailure
from towers.cli.train_flags import SECTIONS, options
from towers.trainer import Trainer


@click.command(name="tower-train", cls=GroupedCommand, sections=SECTIONS)
@options
@click.version_option(common.version(), "--version", prog_name="tower-train",
                      message="%(prog)s %(version)s")
@click.option("--list-devices", is_flag=True, is_eager=True, expose_value=False,
              callback=lambda ctx, param, value: _list_devices(ctx) if value else None,
              help="List the devices TensorFlow sees here (the names --devices takes), "
                   "say why a GPU the driver lists is missing, and exit.")
def tower_train(**flags):
    """Train a model with one explicit tower per device."""
    debug = flags.pop("debug") or os.environ.get("TOWER_TRAIN_DEBUG") == "1"
    save_model = flags.pop("save_model")
    max_restarts = flags.pop("max_restarts")
    if max_restarts:
        try:
            sys.exit(_supervise(flags, max_restarts))
        except TowerError as err:
            _report(err, debug)
    if flags.pop("verbose"):
        from engine import quiet

        quiet.quiet_tensorflow(verbose=True)
    try:
        arguments, fit_arguments = _arguments(flags)
        common.check_output_path("--save-model", save_model if _is_file(save_model) else None)
        common.check_output_dir("--save-model", None if _is_file(save_model) else save_model)
        trainer = _trainer(arguments)
        _fit(trainer, fit_arguments)
        if save_model:
            best = fit_arguments["keep_best"] is not None
            saved = trainer.save(save_model, best=best)
            click.echo(f"tower-train: model saved: {saved}"
                       + (f" (the best epoch's by {fit_arguments['keep_best']})" if best else ""))
    except TowerError as err:
        _report(err, debug)


def _list_devices(ctx: click.Context) -> None:
    """--list-devices: a line per device TensorFlow sees, and exit."""
    from engine.topology import inventory

    click.echo("tower-train: starting TensorFlow ...")
    common.import_tensorflow()
    for line in inventory.device_lines():
        line = common.render(line, FLAGS)
        click.echo(f"  {line}" if line.startswith("/") else f"tower-train: {line}")
    ctx.exit(0)


def _is_file(path: str | None) -> bool:
    """A Keras model file (`.keras`), not a SavedModel folder."""
    return bool(path) and path.endswith(".keras")


def _arguments(flags: dict) -> tuple[dict, dict]:
    """Trainer and fit arguments from the flags, checked as far as can be
    without TensorFlow."""
    from engine.core import schedules
    from engine.run import plan

    fit = {name: flags.pop(name) for name in FIT_FLAGS}
    # --mixed-precision alone leaves the dtype to the towers' kind.
    flags["mixed_precision"] = {None: False, "auto": True}.get(
        flags["mixed_precision"], flags["mixed_precision"])
    fit["profile_steps"] = parse_profile_steps(fit["profile_steps"])
    reducer = plan.reducer_options(flags["reducer"], group_size=flags["group_size"],
                                     pack_bytes=flags["pack_bytes"], compress=flags["compress"],
                                     topology=flags["topology"])
    plan.check_fit(reducer, flags["variables"],
                     **{k: v for k, v in fit.items() if k not in CLI_FIT_FLAGS})
    schedules.of(flags["lr_schedule"], flags["warmup_epochs"]).check_length(fit["epochs"])
    flags["data"] = data_source(flags)
    return flags, fit


def data_source(flags: dict):
    """The `towers.data` source the data flags name (they are popped from
    `flags`), checked as far as can be without TensorFlow."""
    from towers import data as sources

    path, data_format, pipeline, classes, seq_len, samples = (
        flags.pop(k) for k in ("data_path", "data_format", "data_pipeline", "num_classes",
                               "seq_len", "synthetic_samples"))
    if samples is not None and data_format != "synthetic":
        raise UsageFailure(f"--synthetic-samples ({samples}) is for --data-format synthetic")
    if seq_len is not None and data_format != "text":
        raise UsageFailure("--seq-len cuts text into sequences; add --data-format text")
    if classes is not None and data_format not in ("synthetic", "tfrecord", "auto"):
        raise UsageFailure(f"--num-classes is for --data-format synthetic or tfrecord; "
                           f"{data_format} data says its own class count")
    if classes is not None and data_format != "synthetic" and path is None:
        raise UsageFailure("--num-classes is for --data-format synthetic or a --data "
                           "directory of TFRecords; MNIST has 10")
    if pipeline is not None:
        if path is not None or data_format != "auto":
            raise UsageFailure("--data-pipeline reads no --data; drop --data and --data-format")
        return sources.pipeline(pipeline)
    if data_format == "text":
        return sources.text(path, 128 if seq_len is None else seq_len)
    if data_format == "synthetic":
        return sources.synthetic(num_classes=10 if classes is None else classes,
                                 samples=samples)
    if path is None:
        if data_format == "folder":
            raise UsageFailure("--data-format folder reads class folders from --data DIR; "
                               "MNIST comes as caffe2, jpeg or tfrecord")
        return sources.mnist(format="caffe2" if data_format == "auto" else data_format)
    return sources.directory(path, data_format, classes)


FIT_FLAGS = (
    "epochs", "steps_per_epoch", "steps_per_loop", "eval_steps", "metrics",
    "checkpoint_dir", "checkpoint_every", "keep_checkpoints", "keep_best", "resume",
    "placement_log",
    "strict_placement", "max_transfer_bytes", "logdir", "profile_steps", "skip_nonfinite",
    "check_replicas",
)
# fit's arguments that only the command line has.
CLI_FIT_FLAGS = ()


def _trainer(arguments: dict) -> Trainer:
    if arguments["log_device_placement"]:
        from engine import quiet

        quiet.quiet_tensorflow(verbose=True)  # TF prints the placement as INFO
    if _names_user_code(arguments):
        # The Trainer loads user code while it checks its arguments, and user
        # code imports TensorFlow: import it quietly first.
        common.import_tensorflow()
    return CliTrainer(**arguments)


def _names_user_code(arguments: dict) -> bool:
    """True when an argument is a `package.module:function` spec (or a
    built-in's `name:k=v` parameters, which need TensorFlow soon anyway)."""
    return any(isinstance(arguments.get(key), str) and ":" in arguments[key]
               for key in ("model", "optimizer", "loss", "reducer"))


class CliTrainer(Trainer):
    """A Trainer whose messages go to the terminal as tower-train's, in flags."""

    @staticmethod
    def _on_lost(down: tuple[str, ...]) -> None:
        # A deadline passed on the watchdog's thread: under --max-restarts,
        # tell the supervisor and leave at once (it starts the run again).
        from engine.run import supervise

        if supervise.report_lost(supervise.Lost(down)):
            os._exit(supervise.LOST_EXIT)

    @property
    def _resume_hint(self) -> str:
        return resume_command()

    def _before_tensorflow(self) -> None:
        # Bad arguments are refused in a fraction of a second, before the
        # seconds TensorFlow takes to import; then it is imported quietly,
        # and the user is told what the wait is.
        self._say("starting TensorFlow ...")
        common.import_tensorflow()

    def _say(self, message: str) -> None:
        # A line of its own carries the program's name; an indented line
        # continues the one above it (MNIST's preparation steps).
        click.echo(message if message.startswith(" ") else f"tower-train: {message}")

    def _voice(self, verbose: int):
        return CliVoice(self.stream, lambda message: common.render(message, FLAGS), verbose)

    def _warn(self, message: str) -> None:
        sys.stdout.flush()
        click.echo(f"tower-train: error: {common.render(message, FLAGS)}", err=True)
        sys.stderr.flush()


class CliVoice(Voice):
    """The run's lines as tower-train's: its name before the header and the
    warnings, its flags in the text."""

    def header(self, text: str) -> None:
        self.say(f"tower-train: {text}")

    def warn(self, text: str) -> None:
        print(f"tower-train: warning: {self.render(text)}", file=self.stream, flush=True)

    def full_summary(self, log_path: str) -> str:
        placement = common.program("tower-placement")
        return shlex.join([placement, "summary", log_path, "--full"])


def _supervise(flags: dict, max_restarts: int) -> int:
    """--max-restarts N: runs this command line as a child process and
    starts it again from its newest checkpoint when it dies (killed, a
    crash, a lost worker), at most N times (engine.run.supervise)."""
    from engine.run import supervise
    from engine.run.session import cluster_options
    from engine.topology import devices as devs

    if max_restarts < 0:
        raise UsageFailure(f"--max-restarts ({max_restarts}) must be 0 or more")
    request = devs.parse_request(flags["devices"], flags["reduce_device"], flags["gpu_memory"])
    cluster = cluster_options(flags["cluster"], flags["connect_timeout"], request)
    if flags["checkpoint_dir"] is None:
        raise UsageFailure(f"--max-restarts {max_restarts} goes back to the newest checkpoint "
                           "after a crash; add --checkpoint-dir DIR (and --checkpoint-every "
                           "STEPS for checkpoints within an epoch)")
    args = _without_max_restarts(sys.argv[1:])
    return supervise.supervise(
        [sys.executable, *_this_program(), *args], max_restarts=max_restarts,
        cluster=cluster if cluster is not None and cluster.remote_tasks() else None,
        checkpoint_dir=flags["checkpoint_dir"], resume_hint=resume_command(),
        say=lambda line: click.echo(f"tower-train: {line}", err=line.startswith("error:")))


def _this_program() -> list[str]:
    """This command as Python runs it again: its own script (so that the
    child's messages name it as the user called it), else the module."""
    ran = sys.argv[0] if sys.argv else ""
    if os.path.basename(ran) == "tower-train" and os.path.isfile(ran):
        return [ran]
    return ["-m", "towers.cli.train"]


def _without_max_restarts(args: list[str]) -> list[str]:
    """The command line's arguments less --max-restarts and its value."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--max-restarts":
            skip = True
        elif not arg.startswith("--max-restarts="):
            kept.append(arg)
    return kept


def _lost(down: list[str], last) -> None:
    """A lost worker under --max-restarts: tells the supervisor and exits
    with LOST_EXIT, which restarts the run; returns when unsupervised."""
    from engine.run import supervise

    if supervise.report_lost(supervise.Lost(tuple(down), last.step)):
        sys.stdout.flush()
        sys.exit(supervise.LOST_EXIT)


def _fit(trainer, arguments: dict) -> None:
    import tensorflow as tf

    from engine.run.guard import NonFiniteError
    from engine.run.signals import GracefulStop, StopRequested
    from engine.run.supervise import STEP_FILE, StepReport
    from engine.topology.cluster import ClusterUnavailable

    # Under --max-restarts, the supervisor reads the last step from its file.
    last = StepReport(os.environ.get(STEP_FILE))
    try:
        with GracefulStop(say=lambda m: click.echo(
                f"tower-train: {common.render(m, FLAGS)}", err=True)) as stop:
            trainer._stop = stop
            trainer.fit(**arguments, placement_summary=True, callbacks=[last])
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
        common.fail("tower-train", f"{common.render(str(err.message), FLAGS)}; {last}", 1)
    except OSError as err:
        common.fail("tower-train", f"cannot write {err.filename!r}: {err.strerror}", 1)
    except ClusterUnavailable as err:  # a task that stopped answering mid-run
        _lost([err.render(FLAGS)], last)
        raise
    except tf.errors.OpError as err:
        if trainer.cluster is not None:
            from engine.topology import cluster as cluster_lib

            remote = cluster_lib.from_remote(err)
            down = cluster_lib.unreachable(trainer.cluster, patience=3.0 if remote else 0.0)
            if down:
                _lost(down, last)
                common.fail("tower-train", f"lost {'; '.join(down)}; "
                            f"{common.render(trainer._resume_advice(), FLAGS)}", 1)
            if remote:
                # Every task answers again (a worker under --restart-on-exit
                # is back already), but the run lost one: its state is gone.
                first = str(err.message).strip().splitlines()[0][:120]
                _lost([f"a task of the cluster ({first})"], last)
        common.fail("tower-train", op_errors.explain(err, trainer.placement, trainer.info), 1)


def _report(err: TowerError, debug: bool) -> None:
    """One line for an engine error, exit 1 for a failed run and 2 for bad
    input; with --debug, the traceback of the user's code first."""
    from engine.userfn import UserCodeError

    message = err.render(FLAGS)
    if isinstance(err, UserCodeError) and err.original is not None:
        if debug:
            import traceback

            traceback.print_exception(err.original, file=sys.stderr)
        else:
            message += " (--debug prints its traceback)"
    common.fail("tower-train", message, 1 if isinstance(err, RunError) else 2)


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """`A:B` -> (A, B), 1 <= A <= B."""
    if text is None:
        return None
    first, _, last = text.partition(":")
    if not (first.isdigit() and last.isdigit() and 1 <= int(first) <= int(last)):
        raise UsageFailure(
            f"--profile-steps {text!r} is not A:B with 1 <= A <= B, e.g. 20:25"
        )
    return int(first), int(last)


def resume_command(*extra: str) -> str:
    """The command line that was run, with --resume (and `extra` flags),
    beginning with the program as it was called (common.program)."""
    args = [a for a in sys.argv[1:] if a not in ("--resume", *extra)]
    return shlex.join([common.program("tower-train"), *args, "--resume", *extra])


FLAGS = common.flags_of(tower_train, data="--data", path="--data", format="--data-format",
                        pipeline="--data-pipeline", compute_dtype="--mixed-precision",
                        samples="--synthetic-samples")


def main():
    tower_train.main(prog_name="tower-train")


if __name__ == "__main__":
    main()
