"""What every tower-* command shares: one-line errors in flag terms and a quiet
TensorFlow import."""

from __future__ import annotations

import sys

import click

from engine.errors import RunError, TowerError, render

__all__ = ["GroupedCommand", "OneLineCommand", "OneLineGroup", "UsageFailure", "check_output_dir",
           "check_output_path", "fail", "flags_of", "import_tensorflow", "render", "version"]


class UsageFailure(Exception):
    """Bad input: printed as one line, exit code 2."""


def version() -> str:
    """This package's version, as installed (towers.__version__)."""
    from towers import __version__

    return __version__


def fail(prog: str, message: str, code: int = 2) -> None:
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


class OneLineErrors:
    """Mixin for click commands and groups: usage errors are one line, exit 2."""

    def main(self, args=None, **kwargs):
        try:
            return super().main(args, standalone_mode=False, **kwargs)
        except click.exceptions.Abort:
            fail(self.name, "interrupted", 130)
        except click.UsageError as err:
            fail(self.name, err.format_message().replace("\n", " "))
        except UsageFailure as err:
            fail(self.name, str(err))
        except TowerError as err:
            fail(self.name, err.render(flags_of(self)), 1 if isinstance(err, RunError) else 2)


def flags_of(command: click.Command, **synonyms: str) -> dict[str, str]:
    """Argument name -> flag for a command's options (and its subcommands'),
    so the library's errors name flags: `learning_rate` -> `--lr`.

    Args:
      command: a click command or group.
      **synonyms: more names, for arguments no option of the command has.
    """
    flags = {}
    commands = [command, *getattr(command, "commands", {}).values()]
    for each in commands:
        for param in each.params:
            if isinstance(param, click.Option):
                flags[param.name] = max(param.opts, key=len)
                if param.is_bool_flag and param.secondary_opts:
                    flags[f"{param.name}=False"] = param.secondary_opts[0]
    return {**flags, **synonyms}


class OneLineCommand(OneLineErrors, click.Command):
    pass


class GroupedCommand(OneLineCommand):
    """A command whose `--help` lists its options by concern.

    Args:
      sections: title -> the names of the options under it, in order; an
        option in none of them is listed last, under "Other".
    """

    def __init__(self, *args, sections: dict[str, list[str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.sections = sections

    def format_options(self, ctx, formatter) -> None:
        help_option = self.get_help_option(ctx)
        records = {("help" if param is help_option else param.name):
                   param.get_help_record(ctx) for param in self.get_params(ctx)}
        placed = {name for names in self.sections.values() for name in names}
        groups = [(title, names) for title, names in self.sections.items()]
        groups.append(("Other", [name for name in records if name not in placed]))
        for title, names in groups:
            rows = [records[name] for name in names if records.get(name)]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class OneLineGroup(OneLineErrors, click.Group):
    pass


def import_tensorflow() -> None:
    """Imports TensorFlow and the DALI plugin without their C++ start-up
    chatter (engine.quiet); a user who sets TF_CPP_MIN_LOG_LEVEL sees it."""
    from engine import quiet

    quiet.import_quietly()


def check_output_path(flag: str, path: str | None) -> None:
    """Refuses, before any work, an output file that could not be written
    (engine.run.outputs.check_file, in flag terms)."""
    _in_flag_terms(flag, "check_file", path)


def check_output_dir(flag: str, path: str | None) -> None:
    """Refuses, before any work, an output directory that is a file or could
    not be made (engine.run.outputs.check_directory, in flag terms)."""
    _in_flag_terms(flag, "check_directory", path)


def _in_flag_terms(flag: str, check: str, path: str | None) -> None:
    from engine.run import outputs

    name = flag.lstrip("-").replace("-", "_")
    try:
        getattr(outputs, check)(name, path)
    except TowerError as err:
        raise UsageFailure(err.render({name: flag})) from None
