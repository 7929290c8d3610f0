"""A user's own DALI pipeline, as `--data-pipeline tests.user_pipelines:mnist_digits`
and `towers.data.pipeline(...)` take it: real MNIST digits from the Caffe2 LMDB
the tests prepare, read by the user's own reader and decoder chain."""

import os

from nvidia.dali import fn, types


def mnist_digits(shard):
    """Training digits of this shard, flipped left-right at random (the user's
    own augmentation), scaled to [0, 1]; held-out digits read in order."""
    # The tests point TOWER_TEST_MNIST at the copy of MNIST they prepared.
    root = os.environ.get("TOWER_TEST_MNIST", os.path.expanduser("~/.cache/tower-train/mnist"))
    pipe = shard.pipeline()
    split = "train" if shard.training else "val"
    with pipe:
        encoded, labels = fn.readers.caffe2(
            path=os.path.join(root, split), **shard.reader_arguments()
        )
        images = fn.decoders.image(encoded, device="cpu", output_type=types.GRAY)
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            std=[255.0],
            output_layout="HWC",
            mirror=fn.random.coin_flip(probability=0.5) if shard.training else 0,
        )
        pipe.set_outputs(images, fn.cast(labels, dtype=types.INT32))
    return pipe


def not_a_pipeline(shard):
    """Wrong on purpose: returns the batch size instead of a pipeline."""
    return shard.batch_size


def takes_nothing():
    """Wrong on purpose: the contract passes one Shard."""
