"""Where an option is said in more than one place, the places agree: every
argument of the Trainer is a marker the messages can render
(engine.errors.is_argument: ARGUMENTS, or a field of a declared options
class), every flag of tower-train is a Trainer argument or one of the
command line's own (data, processes, output), every Trainer argument a
command line can carry has a flag, and the flags' choices are the engine's
own constants."""

from __future__ import annotations

import inspect

import click

from engine.core.options import OPTIMIZERS, VARIABLE_MODES
from engine.data.inspect import FORMATS
from engine.errors import is_argument
from engine.reducers.options import COMPRESSION_DTYPES
from towers import Trainer
from towers.cli.train import FLAGS, tower_train

# Flags that are the command line's own: they make a towers.data source, run
# processes (the supervisor), or shape the output.
CLI_ONLY = {"data_path", "data_format", "data_pipeline", "seq_len", "num_classes",
            "synthetic_samples", "list_devices", "max_restarts", "save_model", "debug",
            "version"}
# Arguments a command line cannot carry: Python objects, or the calls' own.
PYTHON_ONLY = {"data", "loss", "callbacks", "stream", "placement_summary", "steps", "path",
               "best"}


def trainer_arguments() -> set[str]:
    names = set()
    for method in (Trainer.__init__, Trainer.fit, Trainer.evaluate, Trainer.save):
        names |= set(inspect.signature(method).parameters) - {"self"}
    return names


def train_options() -> dict[str, click.Option]:
    return {p.name: p for p in tower_train.params if isinstance(p, click.Option)}


def test_every_trainer_argument_is_a_marker_messages_render():
    assert {name for name in trainer_arguments() if not is_argument(name)} == set()


def test_every_flag_is_a_trainer_argument_or_the_command_lines_own():
    assert set(train_options()) - trainer_arguments() == CLI_ONLY


def test_every_argument_a_command_line_can_carry_has_a_flag():
    assert trainer_arguments() - set(train_options()) == PYTHON_ONLY
    for name in trainer_arguments() - PYTHON_ONLY:
        assert FLAGS[name].startswith("--"), name


def test_the_flags_choices_are_the_engines_constants():
    options = train_options()
    assert tuple(options["optimizer"].type.choices) == tuple(OPTIMIZERS)
    assert tuple(options["variables"].type.choices) == VARIABLE_MODES
    assert tuple(options["compress"].type.choices) == COMPRESSION_DTYPES
    assert tuple(options["data_format"].type.choices) == ("auto", *FORMATS)
