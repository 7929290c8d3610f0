"""What a data directory holds, found without building a pipeline, and how
DALI's readers shard it: which records each tower reads, how many held-out
batches a pass takes, and which samples of a padded batch are real.

A data directory holds a training split and optionally a held-out one, in one
of these layouts:

* `caffe2`: `train/` and `val/` are LMDB databases (`data.mdb`);
* `folder`: `train/` and `val/` hold one sub-folder of images per class;
* `jpeg`: ImageNet-style JPEGs, as class folders (like `folder`) or as file
  lists `train.txt` and `val.txt` of `path label` lines, paths relative to
  the directory;
* `tfrecord`: `train/` and `val/` hold ImageNet-format TFRecord files
  (`NAME.tfrecord`, or shards named `train-00000-of-01024`;
  `tf.train.Example`s with `image/encoded` and `image/class/label`), each
  with its DALI index `NAME.idx` beside it; a missing index is made with
  DALI's `tfrecord2idx`;
* `text`: `train/` and `val/` TFRecords of byte sequences, made from a text
  corpus by engine.data.text, with its `meta.json`.

An optional `meta.json` (written by `tower-data`) gives `num_classes`,
`image_shape` (how the images are stored) and `augment` (false for digits,
which random flips and crops would spoil).
"""

from __future__ import annotations

import dataclasses
import json
import os

from engine.data.errors import DataError
from engine.data.tfrecord_index import TFRECORD_PATTERN, record_count, tfrecord_files

__all__ = ["DataError", "DatasetInfo", "class_folders", "eval_batches", "inspect",
           "shard_range", "valid_counts"]

FORMATS = ("caffe2", "folder", "jpeg", "tfrecord", "text", "synthetic")
STORED_FORMATS = ("caffe2", "folder", "jpeg", "tfrecord", "text")
# TFRecord files: NAME.tfrecord, or shards named as the Inception scripts name
# ImageNet's (train-00000-of-01024), which have no extension.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a data directory holds, found without building a pipeline.

    Attributes:
      format: one of FORMATS, or `pipeline`.
      train_path, val_path: what the reader reads: an LMDB or folder split,
        a file list (`jpeg`), a folder of TFRecord files (`tfrecord`).
      train_size, val_size: samples, when known.
      num_classes: labels are in [0, num_classes).
      image_shape: how the images are stored, when known (meta.json).
      augment: whether training should use the standard random crop and flip
        (ImageNet-style data) rather than a plain resize.
      seq_len: bytes per sequence of a text corpus (`text`), else None.
    """

    format: str
    train_path: str | None
    val_path: str | None
    train_size: int | None
    val_size: int | None
    num_classes: int
    image_shape: tuple[int, int, int] | None = None
    augment: bool = False
    seq_len: int | None = None


def shard_range(size: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """[start, end) of the records shard `shard_id` of `num_shards` reads.

    The same split DALI's readers make: floor(size * k / num_shards).
    """
    return size * shard_id // num_shards, size * (shard_id + 1) // num_shards


def inspect(path: str | None, data_format: str = "auto",
            num_classes: int | None = None) -> DatasetInfo:
    """Finds the format, splits, sizes and class count of a data directory.

    Args:
      path: the directory (see the module's docstring for the layouts).
      data_format: one of FORMATS, or `auto` to tell them apart.
      num_classes: the class count where the data does not say it (TFRecords
        without meta.json); None: from the data.

    Returns:
      What the directory holds. With `tfrecord`, missing index files have
      been made.

    Raises:
      DataError: naming the path and what a valid one holds.
    """
    if data_format == "synthetic":
        return DatasetInfo("synthetic", None, None, None, None, num_classes or 10)
    if path is None:
        raise DataError("<path> is required unless <format=synthetic>")
    if data_format not in ("auto", *STORED_FORMATS):
        raise DataError(
            f"<format> {data_format!r} is not one of auto, {', '.join(FORMATS)}"
        )
    if not os.path.isdir(path):
        raise DataError(
            f"<path> {path!r} is not a directory; it should hold train/ "
            "(and val/), as written by 'tower-data mnist DIR'"
        )
    meta = _meta(path)
    if data_format == "text" or (data_format == "auto" and meta.get("format") == "text"):
        return _text_info(path, meta)
    if data_format in ("auto", "jpeg") and os.path.isfile(os.path.join(path, "train.txt")):
        return _list_info(path, meta)
    train = os.path.join(path, "train")
    if not os.path.isdir(train):
        raise DataError(
            f"<path> {path!r} has no train/ directory (or train.txt file list); it "
            "should hold train/ (and val/): LMDB databases, class sub-folders or "
            "TFRecord files"
        )
    val = os.path.join(path, "val")
    val = val if os.path.isdir(val) else None
    fmt = _detect(train) if data_format == "auto" else data_format
    _check_format(train, fmt)
    if fmt == "caffe2":
        return _lmdb_info(train, val, meta)
    if fmt == "tfrecord":
        return _tfrecord_info(train, val, meta, num_classes)
    return _folder_info(train, val, fmt, meta)


def _meta(root: str) -> dict:
    """The directory's meta.json, or {}."""
    meta = os.path.join(root, "meta.json")
    if not os.path.isfile(meta):
        return {}
    with open(meta) as stream:
        return json.load(stream)


def _text_info(root: str, meta: dict) -> DatasetInfo:
    """A corpus cut into sequences by engine.data.text."""
    if meta.get("format") != "text":
        raise DataError(f"<path> {root!r} is not a prepared text corpus (no meta.json "
                        "of format text); give the text file itself")
    sizes = [record_count(os.path.join(root, split)) for split in ("train", "val")]
    return DatasetInfo("text", os.path.join(root, "train"), os.path.join(root, "val"),
                       sizes[0], sizes[1], 256, seq_len=int(meta["seq_len"]))


def _described(info: DatasetInfo, meta: dict) -> DatasetInfo:
    """`info` with what meta.json says about classes, shape and augmentation."""
    shape = meta.get("image_shape")
    return dataclasses.replace(
        info,
        num_classes=int(meta.get("num_classes", info.num_classes)),
        image_shape=tuple(shape) if shape else info.image_shape,
        augment=bool(meta.get("augment", info.augment)),
    )


# How messages name what a split holds, by the format that reads it.
_HOLDS = {"caffe2": "an LMDB database (data.mdb)", "tfrecord": "TFRecord files",
          "folder": "class sub-folders", "jpeg": "class sub-folders"}


def _check_format(train: str, fmt: str) -> None:
    """A split that holds another format than the one asked for: said, with
    the format that reads it."""
    try:
        found = _detect(train)
    except DataError:
        return  # holds none: the format's own check says what is missing
    if _HOLDS[found] != _HOLDS[fmt]:
        raise DataError(f"<path>: {train!r} holds {_HOLDS[found]}, which <format={fmt}> does "
                        f"not read (it reads {_HOLDS[fmt]}); give <format={found}> (or "
                        "<format=auto>)")


def _detect(train: str) -> str:
    if os.path.isfile(os.path.join(train, "data.mdb")):
        return "caffe2"
    if tfrecord_files(train)[0]:
        return "tfrecord"
    if class_folders(train):
        return "folder"
    raise DataError(
        f"<path>: {train!r} is neither an LMDB database (data.mdb), nor a folder of "
        f"TFRecord files ({TFRECORD_PATTERN}), nor a folder of class sub-folders"
    )


def _lmdb_info(train: str, val: str | None, meta: dict) -> DatasetInfo:
    from engine.data.records import count_records

    for split in (train, val):
        if split and not os.path.isfile(os.path.join(split, "data.mdb")):
            raise DataError(f"<path>: {split!r} is not an LMDB database (no data.mdb)")
    info = DatasetInfo(
        "caffe2", train, val, count_records(train),
        count_records(val) if val else None, 10,
    )
    return _described(info, meta)


def _list_info(root: str, meta: dict) -> DatasetInfo:
    """JPEGs named by file lists `train.txt` (and `val.txt`) in `root`."""
    train = os.path.join(root, "train.txt")
    val = os.path.join(root, "val.txt")
    val = val if os.path.isfile(val) else None
    labels = {split: _list_labels(split) for split in (train, val) if split}
    largest = max(max(v, default=0) for v in labels.values())
    info = DatasetInfo(
        "jpeg", train, val, len(labels[train]), len(labels[val]) if val else None,
        largest + 1, augment=True,
    )
    return _described(info, meta)


def _list_labels(path: str) -> list[int]:
    """The labels of a DALI file list (`path label` per line), checked."""
    labels = []
    with open(path) as stream:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2 or not parts[1].isdigit():
                raise DataError(
                    f"<path>: {path} line {number} is {line.strip()!r}; a file list has "
                    "'path label' lines, the label a whole number"
                )
            labels.append(int(parts[1]))
    if not labels:
        raise DataError(f"<path>: {path} lists no files")
    return labels


def _tfrecord_info(train: str, val: str | None, meta: dict,
                   num_classes: int | None) -> DatasetInfo:
    sizes = [None if split is None else record_count(split) for split in (train, val)]
    if num_classes is None and "num_classes" not in meta:
        raise DataError(
            f"<num_classes> is needed: {os.path.dirname(train)!r} has TFRecords and no "
            "meta.json saying how many classes they have (ImageNet's from the Inception "
            "scripts: 1001, labels from 1)"
        )
    info = DatasetInfo("tfrecord", train, val, sizes[0], sizes[1],
                       num_classes or 0, augment=True)
    info = _described(info, meta)
    return info if num_classes is None else dataclasses.replace(info, num_classes=num_classes)


def class_folders(root: str) -> list[str]:
    """The class sub-folders of an image-folder split, in the order DALI numbers them."""
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def _folder_info(train: str, val: str | None, fmt: str, meta: dict) -> DatasetInfo:
    classes = class_folders(train)
    if not classes:
        raise DataError(f"<path>: {train!r} has no class sub-folders")

    def count(root: str) -> int:
        return sum(
            f.lower().endswith(IMAGE_EXTENSIONS)
            for c in classes
            if os.path.isdir(os.path.join(root, c))
            for f in os.listdir(os.path.join(root, c))
        )

    if val:
        val_classes = class_folders(val)
        if val_classes != classes:
            raise DataError(
                f"<path>: {val!r} has class folders {val_classes}, train/ has "
                f"{classes}; DALI numbers classes by sorted folder name, so both "
                "must hold the same class folders"
            )
    info = DatasetInfo(fmt, train, val, count(train), count(val) if val else None,
                       len(classes), augment=fmt == "jpeg")
    return _described(info, meta)


def eval_batches(val_size: int, batch_size: int, num_towers: int) -> int:
    """Batches per tower that read every held-out sample exactly once.

    DALI pads every shard to the largest shard's batch count.
    """
    largest = max(
        end - start
        for start, end in (shard_range(val_size, k, num_towers) for k in range(num_towers))
    )
    return -(-largest // batch_size)


def valid_counts(
    val_size: int, batch_size: int, num_towers: int, position: int
) -> list[int]:
    """Real (not padding) samples in each tower's held-out batch `position`.

    `position` counts batches from the start of a pass; it wraps every
    `eval_batches` batches, as the padded readers do.
    """
    position %= eval_batches(val_size, batch_size, num_towers)
    counts = []
    for k in range(num_towers):
        start, end = shard_range(val_size, k, num_towers)
        counts.append(min(max(end - start - position * batch_size, 0), batch_size))
    return counts
