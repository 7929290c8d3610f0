"""Writing images as the ImageNet-style layouts DALI reads: JPEG class folders
with a file list, and TFRecords of `tf.train.Example`s with their indices.

Both write under a temporary name and rename when complete, so an interrupted
run never leaves a half-written split.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable

import numpy as np

__all__ = ["encode_jpeg", "example", "replace_folder", "write_jpeg_split",
           "write_tfrecord_split"]

Progress = Callable[[int, int], None]
JPEG_QUALITY = 95


def encode_jpeg(image: np.ndarray) -> bytes:
    """JPEG bytes of a 2-D uint8 grayscale or (H, W, 3) RGB image."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def example(features: dict[str, bytes | int]) -> bytes:
    """A serialized `tf.train.Example` of bytes and integer features."""
    import tensorflow as tf

    def feature(value: bytes | int) -> tf.train.Feature:
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    return tf.train.Example(features=tf.train.Features(
        feature={key: feature(value) for key, value in features.items()})).SerializeToString()


def replace_folder(final: str, write: Callable[[str], None]) -> None:
    """Calls `write(folder)` on a fresh `final.partial`, then puts it at `final`
    (replacing what was there): an interrupted write leaves no half folder."""
    partial = final + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    write(partial)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(partial, final)


def _report(progress: Progress | None, done: int, total: int) -> None:
    if progress and (done % 5000 == 0 or done == total):
        progress(done, total)


def write_jpeg_split(root: str, split: str, images: np.ndarray, labels: np.ndarray,
                     progress: Progress | None = None, num_classes: int | None = None) -> str:
    """Writes `root/split/LABEL/NNNNNNNN.jpg` and the file list `root/split.txt`.

    A folder is made for every class below `num_classes` (default: the
    largest label + 1), also for classes with no image in this split: DALI
    numbers class folders in sorted order, so every split needs them all.

    The list's lines are `split/LABEL/NNNNNNNN.jpg LABEL`, relative to `root`,
    in index order, so DALI's file reader (`file_root=root`,
    `file_list=root/split.txt`) and its folder reader (`file_root=root/split`)
    both read them.

    Returns:
      The file list's path.
    """
    lines = []

    def write(folder: str) -> None:
        for label in range(num_classes or int(labels.max()) + 1):
            os.makedirs(os.path.join(folder, str(label)))
        for index, (image, label) in enumerate(zip(images, labels)):
            name = f"{int(label)}/{index:08d}.jpg"
            with open(os.path.join(folder, name), "wb") as stream:
                stream.write(encode_jpeg(image))
            lines.append(f"{split}/{name} {int(label)}\n")
            _report(progress, index + 1, len(images))

    replace_folder(os.path.join(root, split), write)
    listing = os.path.join(root, f"{split}.txt")
    with open(listing + ".partial", "w") as stream:
        stream.writelines(lines)
    os.replace(listing + ".partial", listing)
    return listing


def write_tfrecord_split(directory: str, images: np.ndarray, labels: np.ndarray,
                         shards: int = 1, progress: Progress | None = None) -> list[str]:
    """Writes `directory/NAME-0000k-of-0000n.tfrecord` files of ImageNet-format
    `tf.train.Example`s: `image/encoded` (JPEG), `image/format`,
    `image/height`, `image/width`, `image/channels` and `image/class/label`
    (the label as given), records split evenly over `shards` files in order.

    Their DALI index files `NAME-0000k-of-0000n.idx` are made beside them
    with DALI's tfrecord2idx.

    Returns:
      The files written.
    """
    import tensorflow as tf

    from engine.data.tfrecord_index import ensure_indices

    name = os.path.basename(os.path.normpath(directory))
    bounds = np.linspace(0, len(images), shards + 1).astype(int)
    files = []

    def write(folder: str) -> None:
        for shard in range(shards):
            file = f"{name}-{shard:05d}-of-{shards:05d}.tfrecord"
            with tf.io.TFRecordWriter(os.path.join(folder, file)) as writer:
                for index in range(bounds[shard], bounds[shard + 1]):
                    image = images[index]
                    writer.write(example({
                        "image/encoded": encode_jpeg(image),
                        "image/format": b"JPEG",
                        "image/height": image.shape[0],
                        "image/width": image.shape[1],
                        "image/channels": image.shape[2] if image.ndim == 3 else 1,
                        "image/class/label": labels[index],
                    }))
                    _report(progress, index + 1, len(images))
            files.append(os.path.join(directory, file))
        ensure_indices(folder)

    replace_folder(directory, write)
    return files
