"""Byte-level text for language models: a corpus cut into sequences, stored as
TFRecords that DALI's reader shards like any other data.

Sample i is the corpus's bytes [i*T, i*T + T + 1): the model reads the first
T and predicts the last T. The last 5% of the samples (at least one) are held
out. The default corpus exists on every machine with Python, offline: the
standard library's own source files (`*.py` outside test folders), in sorted
order, concatenated.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sysconfig
from collections.abc import Callable

from engine.data.errors import DataError
from engine.data.tfrecord_index import ensure_indices

__all__ = ["DEFAULT_CORPUS", "HELD_OUT", "corpus", "digest", "is_prepared", "prepare",
           "stdlib_corpus"]

DEFAULT_CORPUS = "stdlib"
HELD_OUT = 0.05
META = "meta.json"
FEATURE = "text"
_SKIPPED_FOLDERS = {"test", "tests", "idle_test", "site-packages", "dist-packages",
                    "__pycache__"}

Log = Callable[[str], None]


def stdlib_corpus() -> bytes:
    """The standard library's `*.py` files outside test folders, sorted by
    path, concatenated."""
    root = sysconfig.get_paths()["stdlib"]
    parts = []
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS)
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as stream:
                    parts.append(stream.read())
    return b"".join(parts)


def corpus(source: str | None) -> bytes:
    """The bytes of `source` (a text file), or of the default corpus for None.

    Raises:
      DataError: a file that cannot be read.
    """
    if source is None or source == DEFAULT_CORPUS:
        return stdlib_corpus()
    try:
        with open(source, "rb") as stream:
            return stream.read()
    except OSError as err:
        raise DataError(f"<path> {source!r} cannot be read as a text corpus: "
                        f"{err.strerror}") from None


def is_prepared(directory: str, seq_len: int, source: str | None = None) -> bool:
    """True when `directory` holds this corpus, as it is now (its SHA-256),
    cut into `seq_len` sequences."""
    meta = os.path.join(directory, META)
    if not os.path.isfile(meta):
        return False
    with open(meta) as stream:
        written = json.load(stream)
    return written.get("seq_len") == seq_len and written.get("sha256") == digest(source)


def digest(source: str | None) -> str:
    """The SHA-256 of the corpus, read and hashed once per process for each
    state of the file (its path, size and modification time)."""
    if source is None or source == DEFAULT_CORPUS or not os.path.isfile(source):
        return _digest(source, None)  # the standard library; a missing file raises
    stat = os.stat(source)
    return _digest(source, (os.path.abspath(source), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _digest(source: str | None, state) -> str:
    return hashlib.sha256(corpus(source)).hexdigest()


def prepare(directory: str, source: str | None, seq_len: int, log: Log = print) -> dict:
    """Cuts the corpus into samples of `seq_len` + 1 bytes and writes
    `directory/train` and `directory/val` as TFRecords, with DALI's indices
    and `meta.json` (written last).

    Returns:
      The metadata written.

    Raises:
      DataError: a corpus too short for two samples, or unreadable.
    """
    import tensorflow as tf

    from engine.data.writers import example, replace_folder

    if seq_len < 2:
        raise DataError(f"<seq_len> ({seq_len}) must be at least 2")
    data = corpus(source)
    count = (len(data) - 1) // seq_len
    if count < 2:
        raise DataError(
            f"<path> {source!r} has {len(data)} bytes: too short for two sequences of "
            f"{seq_len} + 1 bytes; use a longer text or a shorter <seq_len>")
    held_out = max(1, int(count * HELD_OUT))
    os.makedirs(directory, exist_ok=True)
    meta_path = os.path.join(directory, META)
    if os.path.exists(meta_path):
        os.remove(meta_path)
    splits = {"train": range(count - held_out), "val": range(count - held_out, count)}
    for split, samples in splits.items():
        log(f"writing {split}: {len(samples)} sequences of {seq_len} + 1 bytes")

        def write(folder: str, samples=samples, split=split) -> None:
            with tf.io.TFRecordWriter(os.path.join(folder, f"{split}.tfrecord")) as writer:
                for i in samples:
                    writer.write(example({FEATURE: data[i * seq_len: i * seq_len + seq_len + 1]}))
            ensure_indices(folder)

        replace_folder(os.path.join(directory, split), write)
    meta = {
        "format": "text",
        "seq_len": seq_len,
        "num_classes": 256,
        "train": count - held_out,
        "val": held_out,
        "source": source or DEFAULT_CORPUS,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    with open(meta_path + ".partial", "w") as stream:
        json.dump(meta, stream, indent=1)
    os.replace(meta_path + ".partial", meta_path)
    return meta
