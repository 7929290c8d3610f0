"""Caffe2 LMDB records, the layout DALI's `fn.readers.caffe2` reads.

Each LMDB value is a serialized Caffe2 `TensorProtos`: `protos[0]` holds the
encoded image (`data_type` STRING, bytes in `string_data`), `protos[1]` the
label (`data_type` INT32, in `int32_data`). The protobuf wire format for those
few fields is written here directly, so no Caffe2 or generated protobuf module
is needed. Images are stored as grayscale PNG, encoded with zlib.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Iterable

import numpy as np

# caffe2.proto: TensorProtos.protos = 1; TensorProto.data_type = 2,
# int32_data = 4, string_data = 6; DataType INT32 = 2, STRING = 4.
_PROTOS, _DATA_TYPE, _INT32_DATA, _STRING_DATA = 1, 2, 4, 6
_INT32, _STRING = 2, 4
_VARINT, _BYTES = 0, 2


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # protobuf encodes negative int32 as 10-byte varints
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _key(field, _BYTES) + _varint(len(payload)) + payload


def tensor_protos(image: bytes, label: int) -> bytes:
    """Serialized Caffe2 TensorProtos holding one encoded image and its label."""
    image_proto = _key(_DATA_TYPE, _VARINT) + _varint(_STRING)
    image_proto += _length_delimited(_STRING_DATA, image)
    label_proto = _key(_DATA_TYPE, _VARINT) + _varint(_INT32)
    label_proto += _length_delimited(_INT32_DATA, _varint(label))  # packed
    return _length_delimited(_PROTOS, image_proto) + _length_delimited(
        _PROTOS, label_proto
    )


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of a 2-D uint8 grayscale image."""
    if image.dtype != np.uint8 or image.ndim != 2:
        raise ValueError(
            f"encode_png takes a 2-D uint8 image, got {image.dtype} {image.shape}"
        )
    height, width = image.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), image], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def write_lmdb(
    path: str,
    images: np.ndarray,
    labels: np.ndarray,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Writes `images` (N, H, W) uint8 and `labels` (N,) as a Caffe2 LMDB.

    Records are keyed by zero-padded index, so DALI reads them in order. The
    database is written under a temporary name and renamed when complete, so an
    interrupted run never leaves a half-written database at `path`.

    Returns:
      The number of records written.
    """
    import lmdb

    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    partial = path + ".partial"
    _remove_tree(partial)
    os.makedirs(partial)
    size = sum(len(r) for r in _records(images[:64], labels[:64]))
    map_size = max(1 << 24, 4 * size * (len(images) // 64 + 1))
    env = lmdb.open(partial, map_size=map_size, subdir=True)
    total = len(images)
    with env.begin(write=True) as txn:
        for i, value in enumerate(_records(images, labels)):
            txn.put(f"{i:08d}".encode(), value)
            if progress and ((i + 1) % 5000 == 0 or i + 1 == total):
                progress(i + 1, total)
    env.sync()
    env.close()
    _remove_tree(path)
    os.rename(partial, path)
    return total


def _records(images: np.ndarray, labels: np.ndarray) -> Iterable[bytes]:
    for image, label in zip(images, labels):
        yield tensor_protos(encode_png(image), int(label))


def count_records(path: str) -> int:
    """Number of records in the LMDB database at `path`."""
    import lmdb

    env = lmdb.open(path, readonly=True, lock=False, subdir=True)
    try:
        return env.stat()["entries"]
    finally:
        env.close()


def _remove_tree(path: str) -> None:
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path)
