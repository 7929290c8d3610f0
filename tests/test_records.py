"""Caffe2 LMDB records: what we write is what DALI's caffe2 reader reads."""

import numpy as np
import pytest
from nvidia.dali import fn, pipeline_def, types

from engine.data import records


@pipeline_def(batch_size=8, num_threads=1, device_id=None)
def read_back(path):
    encoded, labels = fn.readers.caffe2(path=path, random_shuffle=False)
    images = fn.decoders.image(encoded, device="cpu", output_type=types.GRAY)
    return images, labels


def test_dali_reads_back_exact_pixels_and_labels(tmp_path):
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (16, 28, 28), dtype=np.uint8)
    labels = np.array([0, 1, 9, 5, 1000, 123456, 7, 2] * 2)
    path = str(tmp_path / "db")
    assert records.write_lmdb(path, images, labels) == 16
    assert records.count_records(path) == 16

    pipe = read_back(path)
    pipe.build()
    got_images, got_labels = [], []
    for _ in range(2):
        out_images, out_labels = pipe.run()
        got_images.append(np.stack([np.array(t) for t in out_images]))
        got_labels.append(np.array(out_labels.as_tensor()))
    np.testing.assert_array_equal(np.concatenate(got_images)[..., 0], images)
    np.testing.assert_array_equal(np.concatenate(got_labels).ravel(), labels)


def test_label_proto_encodes_negative_labels_as_protobuf_does():
    # int32 -1 is a 10-byte varint on the wire: ff ff ff ff ff ff ff ff ff 01.
    encoded = records.tensor_protos(b"x", -1)
    assert encoded.endswith(b"\x22\x0a" + b"\xff" * 9 + b"\x01")


def test_png_is_refused_for_non_uint8_images():
    with pytest.raises(ValueError, match=r"2-D uint8 image, got float32 \(2, 2\)"):
        records.encode_png(np.zeros((2, 2), np.float32))


def test_an_interrupted_write_leaves_no_database(tmp_path):
    path = str(tmp_path / "db")
    images = np.zeros((10, 28, 28), np.uint8)

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        records.write_lmdb(path, images, np.zeros(10), progress=lambda d, t: stop(d, t))
    assert not (tmp_path / "db").exists()
