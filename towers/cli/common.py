"""What every tower-* command shares: one-line errors in flag terms and a quiet
TensorFlow import."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from engine.errors import RunError, TowerError, render

__all__ = ["GroupedCommand", "OneLineCommand", "OneLineGroup", "UsageFailure", "check_output_dir",
           "check_output_path", "fail", "flags_of", "import_tensorflow", "option_groups", "program",
           "refuse_repeats", "render", "version"]


class UsageFailure(Exception):
    """Bad input: printed as one line, exit code 2."""


def version() -> str:
    """This package's version, as installed (towers.__version__)."""
    from towers import __version__

    return __version__


def program(name: str) -> str:
    """How to run the command `name` (this one or a sibling) from here, for
    the commands a message prints: `name` where the shell finds it beside
    the running one (an activated environment), else by the folder the
    running command was called from (`.venv/bin/tower-train`), shortened to
    the working folder."""
    import os
    import shutil

    ran = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]).startswith("tower-") else ""
    if not ran:
        return name
    beside = os.path.join(os.path.dirname(ran), name)
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(beside):
        return name
    relative = os.path.relpath(beside)
    if relative.startswith(".."):
        return os.path.abspath(beside)
    return relative if os.sep in relative else os.path.join(".", relative)


def fail(prog: str, message: str, code: int = 2) -> None:
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


class OneLineErrors:
    """Mixin for click commands and groups: usage errors are one line, exit 2;
    `-h` is `--help` (for their subcommands too)."""

    def __init__(self, *args, **kwargs):
        settings = kwargs.setdefault("context_settings", {})
        settings.setdefault("help_option_names", ["-h", "--help"])
        super().__init__(*args, **kwargs)

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


def option_groups(command: click.Command, ctx: click.Context
                  ) -> list[tuple[str, list[tuple[str, str]]]]:
    """A command's options as `--help` lists them: (title, [(flags, help)])
    per group, in order. A `GroupedCommand` has its sections (and "Other"
    for the rest); any other command one group, "Options". The docs' command
    reference is made from this too."""
    help_option = command.get_help_option(ctx)
    records = {("help" if param is help_option else param.name): param.get_help_record(ctx)
               for param in command.get_params(ctx) if isinstance(param, click.Option)}
    sections = getattr(command, "sections", None) or {"Options": list(records)}
    placed = {name for names in sections.values() for name in names}
    groups = [*sections.items(), ("Other", [name for name in records if name not in placed])]
    return [(title, rows) for title, names in groups
            if (rows := [records[name] for name in names if records.get(name)])]


def refuse_repeats(command: click.Command, args: Sequence[str]) -> None:
    """An option given twice on one command line (click would keep the last
    silently) is refused, naming both values: `--batch-size 64 ...
    --batch-size 128` is a mistake more often than an override.

    Raises:
      click.UsageError: the option and its values.
    """
    by_flag = {flag: param for param in command.params
               if isinstance(param, click.Option) and not param.multiple and not param.count
               for flag in (*param.opts, *param.secondary_opts)}
    seen: dict[str, tuple[str, str]] = {}
    tokens = list(args)
    for k, token in enumerate(tokens):
        if token == "--":
            break
        flag, _, inline = token.partition("=")
        param = by_flag.get(flag)
        if param is None:
            continue
        takes_value = not param.is_flag and not (param.flag_value is not None and (
            k + 1 == len(tokens) or tokens[k + 1].startswith("-")))
        value = inline or (tokens[k + 1] if takes_value and not inline and k + 1 < len(tokens)
                           else "")
        said = f"{flag} {value}".strip()
        if param.name in seen:
            once = f"give {flag} once" if seen[param.name][1] == flag else "give one of them"
            raise click.UsageError(f"{seen[param.name][0]} and {said} are both given; {once}")
        seen[param.name] = (said, flag)


class OneLineCommand(OneLineErrors, click.Command):
    def parse_args(self, ctx, args):
        refuse_repeats(self, args)
        return super().parse_args(ctx, args)


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
        for title, rows in option_groups(self, ctx):
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
