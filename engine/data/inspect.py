"""What a data directory holds, found without building a pipeline, and how
DALI's readers shard it: which records each tower reads, how many held-out
batches a pass takes, and which samples of a padded batch are real."""

from __future__ import annotations

import dataclasses
import json
import os

from engine.errors import UsageError

__all__ = ["DataError", "DatasetInfo", "class_folders", "eval_batches", "inspect",
           "shard_range", "valid_counts"]

FORMATS = ("caffe2", "folder", "synthetic")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


class DataError(UsageError):
    """Data that cannot be read as asked; the message is one line."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a data directory holds, found without building a pipeline."""

    format: str
    train_path: str | None
    val_path: str | None
    train_size: int | None
    val_size: int | None
    num_classes: int


def shard_range(size: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """[start, end) of the records shard `shard_id` of `num_shards` reads.

    The same split DALI's readers make: floor(size * k / num_shards).
    """
    return size * shard_id // num_shards, size * (shard_id + 1) // num_shards


def inspect(path: str | None, data_format: str = "auto") -> DatasetInfo:
    """Finds the format, splits, sizes and class count of a data directory.

    `path` holds `train/` and optionally `val/`, each an LMDB database
    (`data.mdb`) or a folder of class sub-folders. `auto` tells them apart.

    Raises:
      DataError: naming the path and what a valid one holds.
    """
    if data_format == "synthetic":
        return DatasetInfo("synthetic", None, None, None, None, 10)
    if path is None:
        raise DataError("<path> is required unless <format=synthetic>")
    if data_format not in ("auto", "caffe2", "folder"):
        raise DataError(
            f"<format> {data_format!r} is not one of auto, {', '.join(FORMATS)}"
        )
    if not os.path.isdir(path):
        raise DataError(
            f"<path> {path!r} is not a directory; it should hold train/ "
            "(and val/), as written by 'tower-data mnist DIR'"
        )
    train = os.path.join(path, "train")
    if not os.path.isdir(train):
        raise DataError(
            f"<path> {path!r} has no train/ directory; it should hold train/ "
            "(and val/), each an LMDB database or one sub-folder per class"
        )
    val = os.path.join(path, "val")
    val = val if os.path.isdir(val) else None
    fmt = _detect(train) if data_format == "auto" else data_format
    if fmt == "caffe2":
        return _lmdb_info(path, train, val)
    return _folder_info(train, val)


def _detect(train: str) -> str:
    if os.path.isfile(os.path.join(train, "data.mdb")):
        return "caffe2"
    if class_folders(train):
        return "folder"
    raise DataError(
        f"<path>: {train!r} is neither an LMDB database (data.mdb) nor a folder "
        "of class sub-folders"
    )


def _lmdb_info(root: str, train: str, val: str | None) -> DatasetInfo:
    from engine.data.records import count_records

    for split in (train, val):
        if split and not os.path.isfile(os.path.join(split, "data.mdb")):
            raise DataError(f"<path>: {split!r} is not an LMDB database (no data.mdb)")
    num_classes = 10
    meta = os.path.join(root, "meta.json")
    if os.path.isfile(meta):
        with open(meta) as stream:
            num_classes = int(json.load(stream).get("num_classes", 10))
    return DatasetInfo(
        "caffe2",
        train,
        val,
        count_records(train),
        count_records(val) if val else None,
        num_classes,
    )


def class_folders(root: str) -> list[str]:
    """The class sub-folders of an image-folder split, in the order DALI numbers them."""
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def _folder_info(train: str, val: str | None) -> DatasetInfo:
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
    return DatasetInfo(
        "folder", train, val, count(train), count(val) if val else None, len(classes)
    )


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
