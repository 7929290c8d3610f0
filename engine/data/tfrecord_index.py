"""TFRecord files and their DALI indices: which files a split holds, the
index DALI's reader needs beside each (made where missing, by DALI's own
`tfrecord2idx` or by `write_index`, which writes the same lines), and how
many records a split has.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from engine.data.errors import DataError

__all__ = ["TFRECORD_PATTERN", "ensure_indices", "record_count", "tfrecord_files",
           "write_index"]

TFRECORD_PATTERN = "*.tfrecord or *-NNNNN-of-NNNNN"
_TFRECORD = re.compile(r"(\.tfrecord|-\d{5}-of-\d{5})$")


def tfrecord_files(split: str) -> tuple[list[str], list[str]]:
    """The TFRecord files of a split folder, sorted, and their index files
    (NAME.idx for NAME.tfrecord, NAME.idx beside a shard without extension)."""
    files = sorted(os.path.join(split, f) for f in os.listdir(split) if _TFRECORD.search(f))
    return files, [(f[:-len(".tfrecord")] if f.endswith(".tfrecord") else f) + ".idx"
                   for f in files]


def ensure_indices(split: str) -> list[str]:
    """The index files of a split's TFRecords, made where missing.

    Raises:
      DataError: no TFRecord files, or an index that cannot be made.
    """
    files, indices = tfrecord_files(split)
    if not files:
        raise DataError(f"<path>: {split!r} holds no TFRecord files ({TFRECORD_PATTERN})")
    for file, index in zip(files, indices):
        if not os.path.isfile(index):
            _make_index(file, index)
    return indices


# DALI's script reads TFRecords through TensorFlow when it can import it, else
# as plain files; plain files are all these are, and importing TensorFlow
# would take seconds per file. A None in sys.modules makes the import fail.
_RUN_TFRECORD2IDX = """
import runpy, sys
sys.modules["tensorflow"] = None
script, record, index = sys.argv[1:]
sys.argv = ["tfrecord2idx", record, index]
runpy.run_path(script, run_name="__main__")
"""


def _make_index(file: str, index: str) -> None:
    """Writes DALI's index of `file` with DALI's own `tfrecord2idx` script, or,
    where the wheel's scripts were not installed (pip's target folder, some conda
    builds), with `write_index`, which writes the same lines."""
    import shutil

    script = os.path.join(os.path.dirname(sys.executable), "tfrecord2idx")
    script = script if os.path.isfile(script) else shutil.which("tfrecord2idx")
    partial = index + ".partial"
    if script is None:
        write_index(file, partial)
        os.replace(partial, index)
        return
    try:
        result = subprocess.run([sys.executable, "-c", _RUN_TFRECORD2IDX, script, file, partial],
                                capture_output=True, text=True)
    except OSError as err:
        raise DataError(f"<path>: cannot make the index of {file}: {err}") from None
    if result.returncode != 0 or not os.path.isfile(partial):
        reason = (result.stderr.strip().splitlines() or ["no index written"])[-1]
        raise DataError(f"<path>: DALI's tfrecord2idx failed on {file}: {reason}")
    os.replace(partial, index)


def write_index(file: str, index: str) -> None:
    """DALI's index of a TFRecord file, as its tfrecord2idx writes it: per
    record, its offset and its length with the framing (8-byte length,
    4-byte CRC, the data, 4-byte CRC).

    Raises:
      DataError: a file that is not a complete TFRecord file.
    """
    import struct

    size = os.path.getsize(file)
    lines = []
    with open(file, "rb") as stream:
        offset = 0
        while offset < size:
            header = stream.read(8)
            if len(header) < 8:
                raise DataError(f"<path>: {file} is not a valid TFRecord file "
                                f"(a record header is cut at byte {offset})")
            (length,) = struct.unpack("<q", header)
            record = 8 + 4 + length + 4
            if length < 0 or offset + record > size:
                raise DataError(f"<path>: {file} is not a valid TFRecord file "
                                f"(the record at byte {offset} runs past its end)")
            lines.append(f"{offset} {record}\n")
            offset += record
            stream.seek(offset)
    with open(index, "w") as out:
        out.writelines(lines)


def record_count(split: str) -> int:
    """Records in a split's TFRecord files: lines of their DALI indices."""
    total = 0
    for index in ensure_indices(split):
        with open(index, "rb") as stream:
            total += sum(1 for line in stream if line.strip())
    return total
