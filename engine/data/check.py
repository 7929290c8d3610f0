"""Finding the sample DALI could not decode, after it failed.

DALI reports a decoding failure without naming the file or record, and the
TensorFlow error names only the op (`input_k/IteratorGetNext`, so the tower).
When that happens the run is over anyway; this module then decodes the
split's samples one by one, in DALI's order, to name the bad ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

from engine.data.inspect import IMAGE_EXTENSIONS, class_folders
from engine.data.tfrecord_index import tfrecord_files

_INPUT_NODE = re.compile(r"input_(\d+)/IteratorGetNext")


def failing_tower(message: str) -> int | None:
    """The tower whose batch fetch failed, from a TensorFlow error message."""
    match = _INPUT_NODE.search(message)
    return int(match.group(1)) if match else None


def is_decode_failure(message: str) -> bool:
    return "decoders.image" in message or "nvImageCodec" in message


def _folder_samples(root: str) -> Iterator[tuple[str, bytes]]:
    for name in class_folders(root):
        folder = os.path.join(root, name)
        for file in sorted(os.listdir(folder)):
            if file.lower().endswith(IMAGE_EXTENSIONS):
                path = os.path.join(folder, file)
                with open(path, "rb") as stream:
                    yield path, stream.read()


def _list_samples(listing: str) -> Iterator[tuple[str, bytes]]:
    """The files a DALI file list names, paths relative to its folder."""
    root = os.path.dirname(listing)
    with open(listing) as stream:
        for line in stream:
            if line.strip():
                path = os.path.join(root, line.rsplit(maxsplit=1)[0])
                try:
                    with open(path, "rb") as image:
                        yield path, image.read()
                except OSError:
                    yield path, b""  # a listed file that is not there


def _tfrecord_samples(split: str) -> Iterator[tuple[str, bytes]]:
    import tensorflow as tf

    for file in tfrecord_files(split)[0]:
        for index, record in enumerate(tf.data.TFRecordDataset(file).as_numpy_iterator()):
            example = tf.train.Example.FromString(record)
            encoded = example.features.feature["image/encoded"].bytes_list.value
            yield f"{file} record {index}", encoded[0] if encoded else b""


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of a protobuf message; enough for TensorProtos."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            length, i = _varint(data, i)
            value, i = data[i:i + length], i + length
        else:
            raise ValueError(f"wire type {wire} is not used by TensorProtos")
        yield field, wire, value


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def image_bytes(record: bytes) -> bytes:
    """The encoded image of a Caffe2 TensorProtos record (protos[0].string_data[0])."""
    first = next(v for f, w, v in _fields(record) if f == 1 and w == 2)
    return next(v for f, w, v in _fields(first) if f == 6 and w == 2)


def _lmdb_samples(path: str) -> Iterator[tuple[str, bytes]]:
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, subdir=True)
    try:
        with env.begin() as txn:
            for index, (key, value) in enumerate(txn.cursor()):
                name = f"{path} record {index} (key {key.decode(errors='replace')})"
                try:
                    yield name, image_bytes(value)
                except (StopIteration, IndexError, ValueError):
                    yield name, b""  # not even a TensorProtos: certainly bad
    finally:
        env.close()


def undecodable(
    data_format: str, path: str, progress: Callable[[int], None] = lambda n: None
) -> list[str]:
    """Names of the samples in `path` that cannot be decoded as images."""
    import tensorflow as tf

    if data_format == "caffe2":
        samples = _lmdb_samples(path)
    elif data_format == "tfrecord":
        samples = _tfrecord_samples(path)
    elif os.path.isfile(path):
        samples = _list_samples(path)
    else:
        samples = _folder_samples(path)
    bad = []
    for count, (name, encoded) in enumerate(samples, 1):
        try:
            tf.io.decode_image(encoded, expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
            bad.append(name)
        if count % 10000 == 0:
            progress(count)
    return bad
