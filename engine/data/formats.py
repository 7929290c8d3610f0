"""The built-in formats as DALI pipelines for one shard: the readers of
stored splits (LMDB, class folders and file lists, TFRecords), the standard
ImageNet decoding and augmentation, text sequences, and synthetic images
that show their labels.

`options` is the run's engine.data.DataOptions and `shard` the tower's
engine.data.Shard throughout (pipeline.py, which imports this).
"""

from __future__ import annotations

import os

from engine.data.tfrecord_index import tfrecord_files

__all__ = ["CENTRE_CROP", "CROP_AREA", "CROP_ASPECT", "SYNTHETIC_SEED", "builtin_pipeline"]


def builtin_pipeline(options, path: str | None, shard):
    """The pipeline of a built-in format for `shard`."""
    from nvidia.dali import fn, types

    pipe = shard.pipeline()
    gpu = shard.device_id
    with pipe:
        if options.format == "synthetic":
            images, labels = _synthetic(options, gpu)
        elif options.format == "text":
            images, labels = _sequences(options, path, shard)
        else:
            encoded, labels = _read(options.format, path, shard)
            images = _decode(options, encoded, shard.training, gpu)
            labels = fn.cast(labels, dtype=types.INT32)
        if gpu is not None:
            images, labels = images.gpu(), labels.gpu()
        pipe.set_outputs(images, labels)
    return pipe


SYNTHETIC_SEED = 20161210


def _synthetic(options, gpu: int | None):
    """Random labels, and images that show them: each class has a fixed
    pattern (the sine of a fixed random phase per pixel, at a frequency of
    label + 1), and every image is its class's pattern plus uniform noise.
    A model can learn them, so a falling loss on synthetic data shows that
    training works, with no files at any shape. With `synthetic_samples`,
    the labels are drawn from that many fixed ones and the images have no
    noise: the data is that many fixed samples.

    On a GPU tower (`gpu`), only the labels are drawn on the CPU; the
    pattern, the sine and the noise are computed on the GPU, so that the
    input costs the host nothing (as tf_cnn_benchmarks' synthetic input)."""
    import numpy as np
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    shape = list(options.image_shape)
    rng = np.random.default_rng(SYNTHETIC_SEED)
    phase = rng.uniform(0.0, 2 * np.pi, shape)
    values = list(range(options.num_classes))
    if options.synthetic_samples is not None:
        values = rng.integers(0, options.num_classes, options.synthetic_samples).tolist()
    device = "cpu" if gpu is None else "gpu"
    labels = fn.random.uniform(values=values, dtype=types.INT32, shape=[1])
    pattern = fn.constant(fdata=phase.astype(np.float32).ravel().tolist(), shape=shape,
                          device=device)
    frequency = fn.cast(fn.reshape(labels, shape=[]), dtype=types.FLOAT) + 1.0
    if gpu is not None:
        frequency = frequency.gpu()
    images = 0.5 + 0.25 * dmath.sin(pattern * frequency)
    if options.synthetic_samples is None:
        images = images + fn.random.uniform(range=[-0.25, 0.25], shape=shape, device=device)
    return images, labels


def _sequences(options, path: str, shard):
    """(bytes 0..T-1, bytes 1..T) of each sample of a text corpus, int32."""
    from nvidia.dali import fn, tfrecord, types

    files, indices = tfrecord_files(path)
    features = fn.readers.tfrecord(
        path=files, index_path=indices,
        features={"text": tfrecord.FixedLenFeature((), tfrecord.string, "")},
        **shard.reader_arguments())
    tokens = fn.cast(features["text"], dtype=types.INT32)
    length = options.seq_len
    return tokens[0:length], tokens[1:length + 1]


def _read(data_format: str, path: str, shard):
    """(encoded images, labels) from the shard's part of a stored split."""
    from nvidia.dali import fn, tfrecord

    arguments = shard.reader_arguments()
    if data_format == "caffe2":
        return fn.readers.caffe2(path=path, **arguments)
    if data_format == "tfrecord":
        files, indices = tfrecord_files(path)
        features = fn.readers.tfrecord(
            path=files, index_path=indices, features={
                "image/encoded": tfrecord.FixedLenFeature((), tfrecord.string, ""),
                "image/class/label": tfrecord.FixedLenFeature([1], tfrecord.int64, -1),
            }, **arguments)
        return features["image/encoded"], features["image/class/label"]
    if os.path.isfile(path):  # a file list, its paths relative to its folder
        return fn.readers.file(file_root=os.path.dirname(path), file_list=path, **arguments)
    return fn.readers.file(file_root=path, **arguments)


# The standard ImageNet transforms (as in DALI's and tf_cnn_benchmarks' ResNet-50
# recipes): the area and aspect range of the training crop, and the centre
# crop's share of the resized held-out image.
CROP_AREA = (0.08, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
CENTRE_CROP = 0.875


def _decode(options, encoded, training: bool, gpu: int | None):
    """Images [H, W, C] float32 in [0, 1] from encoded ones, augmented as
    `options.augment` says."""
    from nvidia.dali import fn, types

    height, width, channels = options.image_shape
    decoding = dict(device="mixed" if gpu is not None else "cpu",
                    output_type=types.GRAY if channels == 1 else types.RGB)
    normalise = dict(dtype=types.FLOAT, std=[255.0] * channels, output_layout="HWC")
    if options.augment and training:
        images = fn.decoders.image_random_crop(
            encoded, random_area=list(CROP_AREA), random_aspect_ratio=list(CROP_ASPECT),
            num_attempts=100, **decoding)
        images = fn.resize(images, resize_x=width, resize_y=height)
        normalise["mirror"] = fn.random.coin_flip(probability=0.5)
    elif options.augment:
        images = fn.resize(fn.decoders.image(encoded, **decoding),
                           resize_shorter=round(min(height, width) / CENTRE_CROP))
        normalise["crop"] = (height, width)
    else:
        images = fn.decoders.image(encoded, **decoding)
        stored = options.stored_shape
        if stored is None or tuple(stored[:2]) != (height, width):
            images = fn.resize(images, size=[height, width])
    return fn.crop_mirror_normalize(images, **normalise)
