"""The real MNIST: sources, checksums, and the LMDBs tower-train reads."""

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from engine.data import mnist, records


def test_the_wheel_holds_the_real_digits(digits):
    assert digits.train_images.shape == (60000, 28, 28)
    assert digits.test_images.shape == (10000, 28, 28)
    # The first training and test labels of the standard MNIST files.
    assert digits.train_labels[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]
    assert digits.test_labels[:8].tolist() == [7, 2, 1, 0, 4, 1, 4, 9]
    assert np.bincount(digits.test_labels).tolist() == [
        980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009
    ]
    assert digits.sha256() == mnist.DIGITS_SHA256


def test_prepared_directory_holds_both_splits(mnist_dir):
    with open(os.path.join(mnist_dir, "meta.json")) as stream:
        meta = json.load(stream)
    assert (meta["train"], meta["val"], meta["num_classes"]) == (60000, 10000, 10)
    assert meta["real_mnist"] is True
    assert records.count_records(os.path.join(mnist_dir, "train")) == 60000
    assert records.count_records(os.path.join(mnist_dir, "val")) == 10000


def test_a_tampered_pickle_is_never_unpickled():
    with pytest.raises(mnist.SourceError, match=r"^mnist/data/mnist.pkl.gz has SHA-256 "):
        mnist.from_pickle(b"not the file")


def _write_idx(path, array, magic):
    header = magic.to_bytes(4, "big") + b"".join(
        d.to_bytes(4, "big") for d in array.shape
    )
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.slow
def test_idx_files_give_the_same_digits(digits, tmp_path):
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", digits.train_images, 2051)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", digits.train_labels, 2049)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", digits.test_images, 2051)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", digits.test_labels, 2049)
    assert mnist.load(str(tmp_path), log=print).sha256() == mnist.DIGITS_SHA256


def test_npz_gives_the_same_digits(digits, tmp_path):
    path = str(tmp_path / "mnist.npz")
    np.savez(
        path,
        x_train=digits.train_images,
        y_train=digits.train_labels,
        x_test=digits.test_images,
        y_test=digits.test_labels,
    )
    assert mnist.load(path, log=print).sha256() == mnist.DIGITS_SHA256


def test_missing_idx_file_is_named(tmp_path):
    with pytest.raises(mnist.SourceError, match=r"train-images-idx3-ubyte\[.gz\] is missing"):
        mnist.load(str(tmp_path), log=print)


def test_other_digits_are_written_but_not_called_mnist(digits, tmp_path):
    flipped = mnist.Digits(
        digits.train_images[:100, ::-1], digits.train_labels[:100],
        digits.test_images[:50, ::-1], digits.test_labels[:50],
    )
    said = []
    meta = mnist.write(str(tmp_path / "out"), flipped, "flipped", log=said.append)
    assert (meta["real_mnist"], meta["train"], meta["val"]) == (False, 100, 50)
    assert said[0].startswith("note: these are not the standard MNIST digits")


# Writes a few thousand digits to a directory, reporting what it logged.
WRITER = """
import sys
import numpy as np
from engine.data import mnist
digits = mnist.from_npz(sys.argv[1])
said = []
mnist.write(sys.argv[2], digits, "test", log=said.append)
print("kept" if any(line.endswith(": kept") for line in said) else "wrote")
"""


def test_processes_that_write_one_directory_at_once_take_turns(digits, tmp_path):
    # Two first runs on the default MNIST prepare it at the same moment: the
    # one that waited finds the digits written and keeps them.
    source = str(tmp_path / "digits.npz")
    np.savez(source, x_train=digits.train_images[:4000], y_train=digits.train_labels[:4000],
             x_test=digits.test_images[:1000], y_test=digits.test_labels[:1000])
    out = str(tmp_path / "mnist")
    runs = [subprocess.Popen([sys.executable, "-c", WRITER, source, out],
                             stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    said = sorted(run.communicate(timeout=300)[0].strip() for run in runs)
    assert [run.returncode for run in runs] == [0, 0]
    assert said == ["kept", "wrote"]
    assert mnist.is_prepared(out)
    assert records.count_records(os.path.join(out, "train")) == 4000
    assert records.count_records(os.path.join(out, "val")) == 1000
