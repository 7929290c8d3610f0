"""The files and folders a run will write, checked before its first step.

A run that can only fail at its end (a metrics file in a folder that does
not exist, a checkpoint folder under a file, a disk too full for a
checkpoint) is refused before it starts, naming the argument, so that no
epoch is trained for nothing. Nothing here leaves anything behind: a folder
that does not exist yet is made and taken away again, to find out that it
can be made, and left to be made by what writes into it.
"""

from __future__ import annotations

import os
import shutil

from engine.errors import RunError, UsageError

__all__ = ["OutputError", "check_directory", "check_file", "check_room", "write_failure"]


def _existing_ancestor(path: str) -> str:
    """The nearest part of `path` (itself included) that exists."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return here


def check_file(argument: str, path: str | None) -> None:
    """Refuses a file that could not be appended to (a run adds lines to it).

    Raises:
      UsageError: `path` is a folder, its folder does not exist, or it
        cannot be opened for appending.
    """
    if not path:
        return
    if os.path.isdir(path):
        raise UsageError(f"<{argument}> {path!r} is a directory; give a file name")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageError(f"<{argument}> {path!r}: its directory does not exist")
    existed = os.path.exists(path)
    try:
        open(path, "a").close()  # appending writes nothing: what is there stays
    except OSError as err:
        raise UsageError(f"<{argument}> {path!r} cannot be written: {err.strerror}") from None
    if not existed:
        os.remove(path)


def check_directory(argument: str, path: str | None) -> None:
    """Refuses a folder that is a file, or that could not be made or written.

    Raises:
      UsageError: naming the argument, the path and what is in the way.
    """
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"<{argument}> {path!r} is a file; give a directory")
    ancestor = _existing_ancestor(path)
    if not os.path.isdir(ancestor):
        raise UsageError(
            f"<{argument}> {path!r} cannot be created: {ancestor} is a file, not a "
            "directory; give a directory path"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "written" if ancestor == os.path.abspath(path) else "created"
        raise UsageError(
            f"<{argument}> {path!r} cannot be {what}: {ancestor} is not writable; "
            "give a directory you can write"
        )
    _probe_creation(argument, path, ancestor)


def _probe_creation(argument: str, path: str, ancestor: str) -> None:
    """Makes the missing folders of `path` and takes them away again: what
    permissions do not show (a read-only or virtual file system) shows here,
    before the run, and a refused run leaves nothing behind."""
    missing = []
    head = os.path.abspath(path)
    while head != ancestor:
        missing.append(head)
        head = os.path.dirname(head)
    made = []
    try:
        for folder in reversed(missing):
            os.mkdir(folder)
            made.append(folder)
    except FileExistsError:
        pass  # another process made it meanwhile: it can be created
    except OSError as err:
        raise UsageError(f"<{argument}> {path!r} cannot be created: {err.strerror}; "
                         "give a directory you can write") from None
    finally:
        for folder in reversed(made):  # only what this call made, deepest first
            try:
                os.rmdir(folder)
            except OSError:
                pass


def check_room(argument: str, path: str, needed_bytes: int, free_bytes: int | None = None) -> None:
    """Refuses a folder whose disk has less room than `needed_bytes` (one
    checkpoint's variables, say) and a tenth more for the files around them.

    Args:
      argument: the argument that named the folder.
      path: the folder (it may not exist yet: its disk is its nearest
        existing parent's).
      needed_bytes: what one write will need.
      free_bytes: the free room, for a check by hand; default: the disk's.

    Raises:
      UsageError: naming the argument, both sizes and the fix.
    """
    if free_bytes is None:
        free_bytes = shutil.disk_usage(_existing_ancestor(path)).free
    if free_bytes < needed_bytes * 1.1:
        raise UsageError(
            f"<{argument}> {path!r}: a checkpoint needs about {_size(needed_bytes)} and its "
            f"disk has {_size(free_bytes)} free; free some room or give a directory on "
            "another disk"
        )


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


class OutputError(RunError):
    """A file or folder of the run could not be written mid-run (a full
    disk, a folder that went read-only); the message is one line.

    Attributes:
      checkpoint: the newest complete checkpoint, kept: where a resume goes
        on from (None: none was saved, or the run saves none).
    """

    def __init__(self, message: str, checkpoint: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint


def write_failure(argument: str, path: str, err: Exception, *, what: str,
                  needed: int = 0, kept: str | None = None, checkpoints: bool = False,
                  fixes: str = "", cleaned: str = "") -> OutputError:
    """The one line for `what` (`checkpoint ckpt-40`, `epoch 3's line`) that
    could not be written to `path`, the argument `argument`'s: a full disk
    (what it needs against what is free), a folder that cannot be written,
    or the error's own first line; then the newest complete checkpoint,
    kept (`kept`; `checkpoints`: the run saves them), what was cleaned up
    (`cleaned`), and the fix (`fixes`: more of them, after another
    `argument`)."""
    import errno

    text = str(getattr(err, "strerror", None) or getattr(err, "message", None) or err)
    keeps = (f"; the newest complete checkpoint, {kept}, is kept" if kept else
             "; no complete checkpoint was saved before it" if checkpoints else "")
    keeps += f", and {cleaned}" if cleaned else ""
    if "No space left on device" in text or getattr(err, "errno", None) == errno.ENOSPC:
        free = _size(shutil.disk_usage(_existing_ancestor(path)).free)
        head = (f"{what} needs about {_size(needed)}, with {free} free there" if needed
                else f"{what} was not written, with {free} free there")
        return OutputError(f"<{argument}> {path!r} is full: {head}{keeps}; free some space "
                           f"there (or give another <{argument}>{fixes})", kept)
    for reason in ("Permission denied", "Read-only file system"):
        if reason in text:
            return OutputError(f"<{argument}> {path!r} cannot be written ({reason}): {what} "
                               f"was not written{keeps}; make it writable (or give another "
                               f"<{argument}>)", kept)
    first = text.strip().splitlines()[0][:200] if text.strip() else type(err).__name__
    return OutputError(f"<{argument}> {path!r}: {what} could not be written ({first}){keeps}",
                       kept)
