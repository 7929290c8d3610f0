"""Checkpoints that never lose work: save, keep the last few, resume the newest good one.

A checkpoint holds the variables and optimizer slots (every replica's, with
replicated variables), the global step and skipped-step count, the epoch's
running sums, the held-out position, and the CPU towers' DALI iterators:
CPU pipelines are built with `enable_checkpointing=True`, so the data stream
continues with exactly the next batches. A GPU tower's iterator cannot be
saved (TensorFlow's SerializeIterator has no GPU kernel, and a DALIDataset
that decodes on the GPU lives there), so at resume its reader is replayed:
a new pipeline, seeded as before, reads and drops as many batches as the run
had taken (`replay`), which puts it at the same position.

`tf.train.CheckpointManager` writes the data and index files first and the
`checkpoint` state file last, so a checkpoint that was being written when the
process died is not listed there. A listed checkpoint whose files are damaged
fails to restore; the next older one is tried, with a warning. A save that
fails (a full disk, a folder that went read-only) leaves nothing of itself
behind (TensorFlow's `_temp` folder and any unlisted file of that step are
taken away) and raises one line that says what was needed and what is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.trackable import base as trackable

from engine.core.on_device import OnDevice
from engine.errors import RunError
from engine.run.options import CheckpointOptions
from engine.run.outputs import OutputError, write_failure


class _SaverRetracing(logging.Filter):
    """Keeps TensorFlow's own saver off the terminal: with an I/O device
    (a cluster's checkpoints) every save traces its save function again,
    and TensorFlow warns about it as if it were the user's function."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("MultiDeviceSaver" in message and "retracing" in message)


tf.get_logger().addFilter(_SaverRetracing())


class PinnedIterator(trackable.Trackable):
    """A dataset iterator that saves and restores its state on its own device.

    An iterator asks its dataset for its options when saved, on the device
    the save runs on; a DALIDataset on another task cannot be copied there
    (its handle does not cross the wire), so the save runs on the tower's
    device and only the serialized state travels.
    """

    def __init__(self, iterator, device: str):
        self.iterator = iterator
        self.device = device

    def _serialize_to_tensors(self):
        with tf.device(self.device):
            return self.iterator._serialize_to_tensors()  # noqa: SLF001 (the Trackable protocol)

    def _restore_from_tensors(self, restored_tensors):
        with tf.device(self.device):
            return self.iterator._restore_from_tensors(restored_tensors)  # noqa: SLF001


def saveable_iterators(towers, iterators) -> list:
    """The iterators a checkpoint can hold, in tower order: the CPU towers'.

    A list, as before GPU towers were left out: checkpoints of CPU towers
    keep their layout. Which towers are in it follows from the devices,
    which a resume must keep.
    """
    return [
        PinnedIterator(iterator, tower.device)
        for tower, iterator in zip(towers, iterators)
        if tower.gpu_index is None
    ]


def replay(
    iterators, devices, batches: int, progress: Callable[[int], None] | None = None,
    chunk: int = 500, guard: Callable | None = None,
) -> None:
    """Reads and drops `batches` batches from every iterator, each on its
    device, all towers together; reports the batches done after each chunk.

    With a `guard` (a watchdog's), each chunk runs under its deadline, so a
    long replay is bounded chunk by chunk, not as a whole.
    """
    if not iterators or batches <= 0:
        return

    def drop(count):
        for _ in tf.range(count):
            for iterator, device in zip(iterators, devices):
                with tf.device(device):
                    next(iterator)

    skip = OnDevice(tf.function(drop), devices[0])  # the loop's own ops there too

    done = 0
    while done < batches:
        count = min(chunk, batches - done)
        if guard is None:
            skip(tf.constant(count, tf.int64))
        else:
            guard("replaying the GPU towers' readers", skip, tf.constant(count, tf.int64))
        done += count
        if progress is not None:
            progress(done)


# Errors of a task that went away while a checkpoint was read.
LOST_CONNECTION = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
)


class CheckpointError(RunError):
    """No checkpoint in the directory could be restored; the message is one line."""


class CheckpointWriteError(OutputError):
    """A checkpoint could not be written; the message is one line, and
    `checkpoint` is the newest complete one, kept (None: none yet)."""


def files_of(prefix: str) -> list[str]:
    """The files and folders of checkpoint `prefix` on disk: its index, its
    data shards, and the `_temp` folder a save in progress writes into."""
    import glob

    return sorted(set(glob.glob(glob.escape(prefix) + ".*"))
                  | set(glob.glob(glob.escape(prefix) + "_temp*")))


def disk_bytes(prefix: str) -> int:
    """The bytes checkpoint `prefix`'s files take."""
    import os

    return sum(os.path.getsize(path) for path in files_of(prefix) if os.path.isfile(path))


RUN_KEY = "run/.ATTRIBUTES/VARIABLE_VALUE"  # the run's signature in a checkpoint


def saved_signature(directory: str) -> tuple[str, str] | None:
    """(path, signature) of the newest checkpoint in `directory` whose
    signature reads, or None when there is none. Reads; writes nothing."""
    import glob
    import os
    import re

    state = tf.train.get_checkpoint_state(directory)
    listed = list(reversed(state.all_model_checkpoint_paths)) if state else []
    if not listed:
        found = []
        for index in glob.glob(os.path.join(directory, "ckpt-*.index")):
            match = re.fullmatch(r"ckpt-(\d+)\.index", os.path.basename(index))
            if match:
                found.append((int(match.group(1)), index[: -len(".index")]))
        listed = [path for _, path in sorted(found, reverse=True)]
    for path in listed:
        try:
            return path, tf.train.load_variable(path, RUN_KEY).decode()
        except Exception:  # damaged or missing: restore names it, older ones are tried
            continue
    return None


# Parts of a run's state that a checkpoint may lack (written by a run that
# had none: the top-k sum of a run without top-k); restored when there.
OPTIONAL = ("top_k_sum",)


class Checkpoints:
    """Saves and restores one run's state in `options.directory`."""

    def __init__(self, options: CheckpointOptions, state: dict, warn: Callable[[str], None],
                 size: int = 0):
        """`size`: about how many bytes a checkpoint of `state` takes, for a
        full disk's message before the first one is on disk."""
        self.options = options
        self.warn = warn
        self.size = size
        self.checkpoint = tf.train.Checkpoint(**state)
        # Restored apart: the rest must all be in a checkpoint, these may not.
        self._required = tf.train.Checkpoint(
            **{k: v for k, v in state.items() if k not in OPTIONAL})
        self._optional = {k: v for k, v in state.items() if k in OPTIONAL}
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, options.directory, max_to_keep=options.keep
        )
        self.io = tf.train.CheckpointOptions(experimental_io_device=options.io_device)
        self._sweep_temp()

    def _sweep_temp(self) -> None:
        """Takes away the `_temp` folders of saves that a killed process left
        (TensorFlow writes a checkpoint's data there first); never listed,
        they could only fill the disk."""
        import glob
        import os
        import shutil

        for path in glob.glob(os.path.join(glob.escape(self.options.directory), "ckpt-*_temp")):
            shutil.rmtree(path, ignore_errors=True)

    @property
    def latest(self) -> str | None:
        return self.manager.latest_checkpoint

    def save(self, step: int) -> str:
        """Saves checkpoint `ckpt-step` and returns its path.

        Raises:
          CheckpointWriteError: it could not be written; nothing of it is
            left, and the state file still names the newest complete one.
        """
        import os

        kept = self.manager.latest_checkpoint
        prefix = os.path.join(self.options.directory, f"ckpt-{step}")
        try:
            return self.manager.save(checkpoint_number=step, options=self.io)
        except LOST_CONNECTION:
            raise  # a worker is gone mid-save: the cluster's loss, not the disk's
        except (tf.errors.OpError, OSError) as err:
            self._discard(prefix)
            failure = write_failure(
                "checkpoint_dir", self.options.directory, err,
                what=f"checkpoint {os.path.basename(prefix)}",
                needed=(disk_bytes(kept) if kept else 0) or self.size, kept=kept,
                checkpoints=True, fixes=", or fewer <keep_checkpoints>",
                cleaned="nothing half-written is left")
            raise CheckpointWriteError(failure.message, kept) from None

    def _discard(self, prefix: str) -> None:
        """Takes away what a failed save of `prefix` wrote, unless the state
        file lists it (a complete checkpoint of that step from before), and
        reads the state file again so that `latest` names what is there."""
        import os
        import shutil

        state = tf.train.get_checkpoint_state(self.options.directory)
        listed = {os.path.basename(p) for p in state.all_model_checkpoint_paths} if state else ()
        complete = os.path.basename(prefix) in listed
        for path in files_of(prefix):
            if not complete or path.startswith(prefix + "_temp"):
                (shutil.rmtree if os.path.isdir(path) else os.remove)(path)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self.options.directory, max_to_keep=self.options.keep)

    def restore(self) -> str | None:
        """Restores the newest checkpoint that loads; returns its path, or None
        when the directory holds none.

        Raises:
          CheckpointError: checkpoints exist but none of them restores.
        """
        listed = list(reversed(self.manager.checkpoints))
        if not listed:
            listed = self._unlisted()
        for path in listed:
            try:
                status = self._required.restore(path, options=self.io)
                status.assert_existing_objects_matched()
                # Saved values this run has no object for (another tower count,
                # say) are judged by the caller, not warned about at exit.
                status.expect_partial()
                if self._optional:
                    tf.train.Checkpoint(**self._optional).restore(
                        path, options=self.io).expect_partial()
                # The saving object numbers its checkpoints on from the restored.
                self.checkpoint.save_counter.assign(self._required.save_counter)
            except LOST_CONNECTION:
                raise  # a worker is gone: not the file's fault, and no older one helps
            # A damaged file fails in many ways (IndexError, DataLossError, ...).
            except Exception as err:
                reason = str(err).strip().splitlines()[0][:160]
                self.warn(f"checkpoint {path} cannot be restored ({reason}); trying an older one")
                continue
            return path
        if listed:
            raise CheckpointError(
                f"<resume>: none of the {len(listed)} checkpoints in "
                f"{self.options.directory} can be restored; see the warnings above"
            )
        return None

    def _unlisted(self) -> list[str]:
        """Checkpoints on disk that the state file does not list (it is missing
        or damaged), newest first."""
        import glob
        import os
        import re

        found = []
        for index in glob.glob(os.path.join(self.options.directory, "ckpt-*.index")):
            match = re.fullmatch(r"ckpt-(\d+)\.index", os.path.basename(index))
            if match:
                found.append((int(match.group(1)), index[: -len(".index")]))
        if found:
            self.warn(
                f"{self.options.directory}/checkpoint, the list of checkpoints, is "
                f"missing or damaged; trying the {len(found)} checkpoint(s) on disk"
            )
        return [path for _, path in sorted(found, reverse=True)]

    def should_save(self, step: int) -> bool:
        return bool(self.options.every) and step % self.options.every == 0
