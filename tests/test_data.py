"""One DALI shard per tower: disjoint, covering, on the tower's device."""

import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import flag_message, without_gpu

from engine import data
from engine.data import records
from engine.topology.devices import Tower

SIZE = 120


@pytest.fixture(scope="module")
def indexed_lmdb(tmp_path_factory, digits):
    """Real digits whose labels are their record index, to identify each sample."""
    root = tmp_path_factory.mktemp("indexed")
    records.write_lmdb(str(root / "train"), digits.train_images[:SIZE], np.arange(SIZE))
    records.write_lmdb(str(root / "val"), digits.test_images[:100], np.arange(100))
    return root


def options(root, batch_size, fmt="caffe2", **kwargs):
    return data.DataOptions(
        format=fmt,
        train_path=str(root / "train") if root else None,
        val_path=str(root / "val") if root else None,
        batch_size=batch_size,
        num_threads=1,
        **kwargs,
    )


def read(dataset, batches, device="/cpu:0"):
    """The first `batches` batches, iterated on `device` as the engine does."""
    images, labels = [], []
    with tf.device(device):
        iterator = iter(dataset)
        for _ in range(batches):
            x, y = next(iterator)
            images.append(x)
            labels.append(y.numpy().ravel())
    return images, np.concatenate(labels)


@pytest.mark.parametrize("num_towers", [1, 2, 3, 4])
def test_shards_are_disjoint_and_cover_each_epoch(indexed_lmdb, num_towers):
    batch = 8
    shard = SIZE // num_towers
    seen = []
    for k in range(num_towers):
        tower = Tower(k, f"/cpu:{k}", num_towers)
        dataset = data.tower_dataset(options(indexed_lmdb, batch), tower, training=True)
        images, labels = read(dataset, -(-2 * shard // batch), tower.device)
        assert {x.device for x in images} == {f"/job:localhost/replica:0/task:0/device:CPU:{k}"}
        seen.append(labels)
    for epoch in range(2):
        per_tower = [set(s[epoch * shard:(epoch + 1) * shard].tolist()) for s in seen]
        assert [len(s) for s in per_tower] == [shard] * num_towers  # no repeats
        assert set().union(*per_tower) == set(range(SIZE))  # covers, so disjoint


def test_training_shards_are_shuffled(indexed_lmdb):
    dataset = data.tower_dataset(options(indexed_lmdb, 60), Tower(0, "/cpu:0", 2), training=True)
    _, labels = read(dataset, 1)
    assert sorted(labels.tolist()) == list(range(60))
    assert labels.tolist() != list(range(60))


def test_pixels_arrive_scaled_to_unit_range(indexed_lmdb, digits):
    tower = Tower(1, "/cpu:1", 2)
    dataset = data.tower_dataset(options(indexed_lmdb, 10), tower, training=False)
    images, labels = read(dataset, 1, tower.device)
    assert images[0].shape == (10, 28, 28, 1)
    expected = digits.test_images[labels].astype(np.float32) / 255.0
    np.testing.assert_allclose(images[0].numpy()[..., 0], expected, atol=1e-6)


def test_held_out_pass_reads_every_sample_once(indexed_lmdb):
    # 100 samples on 3 towers: shards of 33, 33 and 34; batches of 11 make the
    # short shards one batch shorter, which DALI pads.
    batch, towers, size = 11, 3, 100
    steps = data.eval_batches(size, batch, towers)
    assert steps == 4
    real = []
    for k in range(towers):
        tower = Tower(k, f"/cpu:{k}", towers)
        dataset = data.tower_dataset(options(indexed_lmdb, batch), tower, training=False)
        _, labels = read(dataset, 2 * steps, tower.device)  # two passes
        for position in range(2 * steps):
            valid = data.valid_counts(size, batch, towers, position)[k]
            real.extend(labels[position * batch: position * batch + valid].tolist())
    assert sorted(real) == sorted(list(range(size)) * 2)


def test_folder_format_labels_by_sorted_class_folder(tmp_path, digits):
    for name, index in (("cat", 3), ("ant", 0), ("bee", 1)):
        folder = tmp_path / "train" / name
        folder.mkdir(parents=True)
        for i in range(4):
            (folder / f"{i}.png").write_bytes(records.encode_png(digits.train_images[index]))
    info = data.inspect(str(tmp_path))
    assert (info.format, info.train_size, info.num_classes, info.val_path) == (
        "folder", 12, 3, None)
    dataset = data.tower_dataset(options(tmp_path, 12, fmt="folder"), Tower(0, "/cpu:0", 1),
                                 training=True)
    images, labels = read(dataset, 1)
    assert sorted(labels.tolist()) == [0] * 4 + [1] * 4 + [2] * 4  # ant, bee, cat
    for image, label in zip(images[0].numpy(), labels):
        source = digits.train_images[{0: 0, 1: 1, 2: 3}[label]]
        np.testing.assert_allclose(image[..., 0] * 255, source, atol=1.0)


def test_synthetic_data_differs_per_tower_and_stays_in_range():
    opts = options(None, 32, fmt="synthetic")
    towers = [Tower(k, f"/cpu:{k}", 2) for k in range(2)]
    batches = [
        read(data.tower_dataset(opts, t, training=True), 1, t.device) for t in towers
    ]
    for images, labels in batches:
        x = images[0].numpy()
        assert x.shape == (32, 28, 28, 1) and 0.0 <= x.min() and x.max() <= 1.0
        assert set(labels.tolist()) <= set(range(10)) and len(set(labels.tolist())) > 3
    assert not np.array_equal(batches[0][0][0].numpy(), batches[1][0][0].numpy())


@without_gpu
def test_gpu_tower_without_gpu_fails_clearly(indexed_lmdb):
    with pytest.raises(data.GpuUnavailableError) as err:
        data.tower_pipeline(options(indexed_lmdb, 8), Tower(0, "/gpu:0", 1), training=True)
    assert flag_message(err.value) == (
        "tower 0 on /gpu:0 decodes on the GPU (DALI device='mixed'), but this "
        "machine has no GPU; use --devices cpu:N"
    )
    remote = Tower(1, "/job:worker/task:1/gpu:0", 2)
    with pytest.raises(data.GpuUnavailableError) as err:
        data.tower_pipeline(options(indexed_lmdb, 8), remote, training=True)
    assert flag_message(err.value) == (
        "tower 1 on /job:worker/task:1/gpu:0 decodes on its worker's GPU, but DALI "
        "builds every pipeline in the training process and needs a GPU driver on "
        "this machine too; train from one of the GPU hosts"
    )


@pytest.mark.parametrize(
    "setup, fmt, message",
    [
        (lambda p: None, "auto", r"has no train/ directory"),
        (lambda p: (p / "train").mkdir(), "auto", r"is neither an LMDB database \(data.mdb\), "
            "nor a "
         r"folder of TFRecord files \(\*.tfrecord or \*-NNNNN-of-NNNNN\), nor a folder of class "
             "sub-folders"),
        (lambda p: (p / "train").mkdir(), "tfrecord", r"holds no TFRecord files \(\*.tfrecord or "
            r"\*-NNNNN-of-NNNNN\)"),
        (lambda p: (p / "train.txt").write_text("a.jpg cat\n"), "jpeg",
         r"train.txt line 1 is 'a.jpg cat'; a file list has 'path label' lines"),
        (lambda p: (p / "train").mkdir(), "caffe2", r"is not an LMDB database \(no data.mdb\)"),
        # Another format than the one asked for: said, with the one that reads it.
        (lambda p: (p / "train" / "x").mkdir(parents=True), "caffe2", r"/train' holds class "
            r"sub-folders, which --data-format caffe2 does not read \(it reads an LMDB database "
            r"\(data.mdb\)\); give --data-format folder \(or --data-format auto\)$"),
        (lambda p: ((p / "train").mkdir(), (p / "train" / "data.mdb").write_bytes(b"")), "jpeg",
         r"/train' holds an LMDB database \(data.mdb\), which --data-format jpeg does not read "
         r"\(it reads class sub-folders\); give --data-format caffe2"),
    ],
)
def test_bad_data_directories_are_named(tmp_path, setup, fmt, message):
    setup(tmp_path)
    with pytest.raises(data.DataError) as err:
        data.inspect(str(tmp_path), fmt)
    assert re.search(message, flag_message(err.value))


def test_shard_range_matches_dali_split():
    assert [data.shard_range(100, k, 3) for k in range(3)] == [(0, 33), (33, 66), (66, 100)]
    assert data.valid_counts(100, 11, 3, 3) == [0, 0, 1]
    assert data.valid_counts(100, 11, 3, 4) == [11, 11, 11]  # a new pass
