"""ImageNet-style data: JPEG class folders and file lists, TFRecords with DALI
indices, resizing to the model's shape and colour, the standard augmentation,
and learnable synthetic images. All on real digits, read back through DALI."""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import towers
from engine import data
from engine.data import check, mnist
from engine.topology.devices import Tower

TRAIN, TEST = 96, 32
TOWER = Tower(0, "/cpu:0", 1)


@pytest.fixture(scope="module")
def small(digits):
    return mnist.Digits(digits.train_images[:TRAIN], digits.train_labels[:TRAIN],
                        digits.test_images[:TEST], digits.test_labels[:TEST])


@pytest.fixture(scope="module")
def written(small, tmp_path_factory):
    """The small digits as jpeg (file lists), jpeg (class folders only) and tfrecord."""
    root = tmp_path_factory.mktemp("formats")
    out = {}
    for fmt in ("jpeg", "tfrecord"):
        mnist.write(str(root / fmt), small, "test", log=lambda m: None, format=fmt)
        out[fmt] = root / fmt
    folders = root / "jpeg-folders"
    shutil.copytree(out["jpeg"], folders)
    for listing in ("train.txt", "val.txt"):
        os.remove(folders / listing)
    out["jpeg-folders"] = folders
    return out


def read_held_out(info, batch, **kwargs):
    options = data.DataOptions(format=info.format, train_path=info.train_path,
                               val_path=info.val_path, batch_size=batch, num_threads=1,
                               stored_shape=info.image_shape, **kwargs)
    with tf.device("/cpu:0"):
        images, labels = next(iter(data.tower_dataset(options, TOWER, training=False)))
    return images.numpy(), labels.numpy().ravel()


def test_fixed_synthetic_samples_repeat_exactly():
    """synthetic_samples=5 at 1000 classes: every image of a label is the
    same image, and a large batch holds at most the 5 fixed samples."""
    options = data.DataOptions(format="synthetic", train_path=None, val_path=None,
                               batch_size=256, num_threads=1, image_shape=(8, 8, 3),
                               num_classes=1000, synthetic_samples=5)
    with tf.device("/cpu:0"):
        images, labels = next(iter(data.tower_dataset(options, TOWER, training=True)))
    images, labels = images.numpy().reshape(256, -1), labels.numpy().ravel()
    assert 1 < len(set(labels.tolist())) <= 5 and labels.max() < 1000
    assert len(np.unique(images, axis=0)) == len(set(labels.tolist()))
    for label in set(labels.tolist()):
        np.testing.assert_array_equal(images[labels == label], images[labels == label][:1].repeat(
            (labels == label).sum(), axis=0))
    with pytest.raises(data.DataError, match=r"^samples \(0\) must be at least 1$"):
        towers.data.synthetic(samples=0)
    with pytest.raises(data.DataError, match=r"^samples \(3\) is for format='synthetic' data"):
        data.DataOptions(format="caffe2", train_path="x", val_path=None, batch_size=1,
                         synthetic_samples=3)


@pytest.mark.parametrize("layout", ["jpeg", "jpeg-folders", "tfrecord"])
def test_each_layout_reads_back_the_digits(written, small, layout):
    info = data.inspect(str(written[layout]), layout.split("-")[0])
    assert (info.train_size, info.val_size, info.num_classes) == (TRAIN, TEST, 10)
    assert (info.image_shape, info.augment) == ((28, 28, 1), False)  # meta.json: digits
    images, labels = read_held_out(info, TEST)
    if layout == "jpeg-folders":  # DALI reads class folders in label order
        order = np.argsort(small.test_labels, kind="stable")
        expected_images, expected_labels = small.test_images[order], small.test_labels[order]
    else:
        expected_images, expected_labels = small.test_images, small.test_labels
    np.testing.assert_array_equal(labels, expected_labels)
    error = np.abs(images[..., 0] * 255 - expected_images.astype(np.float32))
    assert error.mean() < 2.0  # JPEG at quality 95


def test_images_are_resized_to_the_models_shape_in_colour(written, small):
    info = data.inspect(str(written["tfrecord"]))
    assert info.format == "tfrecord"
    images, _ = read_held_out(info, 8, image_shape=(32, 32, 3))
    assert images.shape == (8, 32, 32, 3)
    np.testing.assert_array_equal(images[..., 0], images[..., 2])  # grey in three channels
    # The digit is still there: the resized image correlates with the original.
    original = tf.image.resize(small.test_images[:8, ..., None] / 255.0, [32, 32]).numpy()
    assert np.corrcoef(images[..., 0].ravel(), original.ravel())[0, 1] > 0.95


def test_augmentation_crops_and_flips_for_training_and_centre_crops_held_out(written):
    info = data.inspect(str(written["jpeg"]))
    options = data.DataOptions(format="jpeg", train_path=info.train_path,
                               val_path=info.val_path, batch_size=TRAIN, num_threads=1,
                               image_shape=(24, 24, 1), augment=True, seed=3)
    plain = data.DataOptions(format="jpeg", train_path=info.train_path,
                             val_path=info.val_path, batch_size=TRAIN, num_threads=1,
                             image_shape=(24, 24, 1), seed=3)
    with tf.device("/cpu:0"):
        augmented, labels = next(iter(data.tower_dataset(options, TOWER, training=True)))
        resized, same_labels = next(iter(data.tower_dataset(plain, TOWER, training=True)))
        centred, _ = next(iter(data.tower_dataset(options, TOWER, training=False)))
    assert augmented.shape == resized.shape == (TRAIN, 24, 24, 1)
    np.testing.assert_array_equal(labels, same_labels)  # the same shuffle
    # Random crops and flips: most images differ from the plain resize.
    differs = np.abs(augmented.numpy() - resized.numpy()).mean(axis=(1, 2, 3)) > 0.02
    assert differs.mean() > 0.8
    assert centred.shape == (TRAIN, 24, 24, 1)  # 32 held-out digits, padded
    assert 0.0 <= float(tf.reduce_min(augmented)) and float(tf.reduce_max(augmented)) <= 1.0


def test_a_missing_tfrecord_index_is_made_again(written, tmp_path):
    copy = tmp_path / "records"
    shutil.copytree(written["tfrecord"], copy)
    index = copy / "train" / "train-00001-of-00002.idx"
    original = index.read_text()
    index.unlink()
    info = data.inspect(str(copy))
    assert info.train_size == TRAIN and index.read_text() == original
    assert len(original.splitlines()) == TRAIN // 2


def test_the_index_fallback_writes_what_dalis_script_writes(written, tmp_path):
    from engine.data.tfrecord_index import tfrecord_files, write_index

    for file, index in zip(*tfrecord_files(str(written["tfrecord"] / "train"))):
        write_index(file, str(tmp_path / "ours.idx"))  # where DALI's script is missing
        assert (tmp_path / "ours.idx").read_text() == open(index).read()
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(open(file, "rb").read()[:-3])
    with pytest.raises(data.DataError, match="runs past its end"):
        write_index(str(cut), str(tmp_path / "cut.idx"))


def test_imagenet_shard_names_without_extension_are_read(written, tmp_path):
    """The Inception scripts name ImageNet's shards train-00000-of-01024."""
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        for k, file in enumerate(sorted((written["tfrecord"] / split).glob("*.tfrecord"))):
            shutil.copy(file, tmp_path / split / f"{split}-{k:05d}-of-00002")
    info = data.inspect(str(tmp_path), "tfrecord", num_classes=10)
    assert (info.train_size, info.val_size) == (TRAIN, TEST)
    assert (tmp_path / "train" / "train-00001-of-00002.idx").is_file()
    images, labels = read_held_out(info, 8)
    assert images.shape == (8, 28, 28, 1) and len(labels) == 8


def test_tfrecords_without_meta_need_num_classes(written, tmp_path):
    copy = tmp_path / "records"
    shutil.copytree(written["tfrecord"], copy)
    os.remove(copy / "meta.json")
    with pytest.raises(data.DataError, match=r"^num_classes is needed"):
        data.inspect(str(copy))
    info = data.inspect(str(copy), num_classes=1001)
    assert (info.num_classes, info.augment) == (1001, True)  # ImageNet-style by default


def test_a_truncated_jpeg_is_named_by_its_file_in_lists_and_records(written, tmp_path):
    copy = tmp_path / "jpeg"
    shutil.copytree(written["jpeg"], copy)
    listed = (copy / "train.txt").read_text().splitlines()[5].split()[0]
    path = copy / listed
    path.write_bytes(path.read_bytes()[:60])  # cut short, as by a failed copy
    assert check.undecodable("jpeg", str(copy / "train.txt")) == [str(path)]
    assert check.undecodable("tfrecord", str(written["tfrecord"] / "train")) == []


def test_synthetic_images_show_their_class():
    """A nearest-class-mean classifier fitted on one batch labels another."""
    options = data.DataOptions(format="synthetic", train_path=None, val_path=None,
                               batch_size=512, num_threads=1, image_shape=(16, 16, 3))
    with tf.device("/cpu:0"):
        iterator = iter(data.tower_dataset(options, TOWER, training=True))
        (x1, y1), (x2, y2) = next(iterator), next(iterator)
    x1, x2 = x1.numpy().reshape(512, -1), x2.numpy().reshape(512, -1)
    y1, y2 = y1.numpy().ravel(), y2.numpy().ravel()
    assert 0.0 <= x1.min() and x1.max() <= 1.0
    means = np.stack([x1[y1 == c].mean(axis=0) for c in range(10)])
    predicted = np.argmin(((x2[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == y2).mean() > 0.95


@pytest.mark.parametrize("layout", ["jpeg", "jpeg-folders", "tfrecord"])
def test_each_layout_trains_resized_for_the_model(written, layout):
    fmt = layout.split("-")[0]
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model="lenet", batch_size=16,
                             image_size=32, learning_rate=3e-3,
                             data=towers.data.directory(str(written[layout]), fmt))
    with open(os.devnull, "w") as quiet:
        trainer.stream = quiet
        records = trainer.fit(epochs=4, steps_per_epoch=TRAIN // 32)
    assert trainer.options.data.image_shape == (32, 32, 1)
    assert records[-1]["loss"] < records[0]["loss"]
    assert records[-1]["eval_samples"] == TEST
