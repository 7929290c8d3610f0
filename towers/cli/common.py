"""What every tower-* command shares: one-line errors in flag terms and a quiet
TensorFlow import."""

from __future__ import annotations

import os
import sys

import click

from engine.errors import RunError, TowerError, render

__all__ = ["OneLineCommand", "OneLineGroup", "UsageFailure", "check_output_dir",
           "check_output_path", "fail", "flags_of", "import_tensorflow", "render"]


class UsageFailure(Exception):
    """Bad input: printed as one line, exit code 2."""


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


class OneLineGroup(OneLineErrors, click.Group):
    pass


def import_tensorflow() -> None:
    """Imports TensorFlow and the DALI plugin without their C++ start-up chatter.

    TensorFlow and the plugin log CUDA probing and CPU features to fd 2 before
    TF_CPP_MIN_LOG_LEVEL takes effect, so fd 2 is pointed at /dev/null for the
    imports alone. A user who sets TF_CPP_MIN_LOG_LEVEL sees everything.
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        import nvidia.dali.plugin.tf  # noqa: F401
        import tensorflow  # noqa: F401

        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import nvidia.dali.plugin.tf  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def check_output_path(flag: str, path: str | None) -> None:
    """Refuses, before any work, an output file that could not be written."""
    if not path:
        return
    if os.path.isdir(path):
        raise UsageFailure(f"{flag} {path!r} is a directory; give a file name")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageFailure(f"{flag} {path!r}: its directory does not exist")
    existed = os.path.exists(path)
    try:
        open(path, "a").close()  # appending writes nothing: what is there stays
    except OSError as err:
        raise UsageFailure(f"{flag} {path!r} cannot be written: {err.strerror}")
    if not existed:
        os.remove(path)


def check_output_dir(flag: str, path: str | None) -> None:
    """Refuses, before any work, an output directory that is a file."""
    if path and os.path.exists(path) and not os.path.isdir(path):
        raise UsageFailure(f"{flag} {path!r} is a file; give a directory")
