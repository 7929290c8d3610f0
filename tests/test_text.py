"""Byte-level language modelling: the corpus cut into sequences on DALI, the
causal Transformer with tied output, and per-position labels in the step."""

import io
import os

import numpy as np
import pytest
import tensorflow as tf

import towers
from engine.data import text
from engine.data.inspect import inspect
from engine.data.pipeline import DataOptions, tower_dataset
from engine.topology.devices import Tower
from towers import models

SEQ = 16


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """A real text: this repository's engine sources, in sorted order."""
    root = os.path.join(os.path.dirname(__file__), "..", "engine", "core")
    data = b"".join(open(os.path.join(root, f), "rb").read()
                    for f in sorted(os.listdir(root)) if f.endswith(".py"))
    path = tmp_path_factory.mktemp("corpus") / "core.txt"
    path.write_bytes(data)
    return path


def test_sequences_are_the_corpus_shifted_by_one(corpus_file, tmp_path):
    meta = text.prepare(str(tmp_path), str(corpus_file), SEQ, log=lambda m: None)
    data = corpus_file.read_bytes()
    count = (len(data) - 1) // SEQ
    assert (meta["train"] + meta["val"], meta["val"]) == (count, max(1, int(count * 0.05)))
    info = inspect(str(tmp_path))
    assert (info.format, info.seq_len, info.num_classes) == ("text", SEQ, 256)
    options = DataOptions(format="text", train_path=info.train_path, val_path=info.val_path,
                          batch_size=4, seq_len=SEQ, num_threads=1)
    with tf.device("/cpu:0"):
        inputs, targets = next(iter(tower_dataset(options, Tower(0, "/cpu:0", 1),
                                                  training=False)))
    assert inputs.dtype == targets.dtype == tf.int32 and inputs.shape == (4, SEQ)
    first = meta["train"]  # the held-out split, read in order
    for row, (x, y) in enumerate(zip(inputs.numpy(), targets.numpy())):
        start = (first + row) * SEQ
        assert bytes(x.astype(np.uint8)) == data[start:start + SEQ]
        assert bytes(y.astype(np.uint8)) == data[start + 1:start + SEQ + 1]


def test_the_default_corpus_is_the_standard_library_in_sorted_order():
    data = text.stdlib_corpus()
    assert len(data) > 1_000_000 and b"def " in data[:100_000]
    assert data == text.stdlib_corpus()  # the same bytes every time


def test_transformer_is_causal_with_tied_output():
    model = models.builder("transformer:layers=1,width=32,heads=2")((SEQ,), 256)
    names = [v.path for v in model.trainable_variables]
    assert len(names) == len(set(names))  # the tied table is one variable
    assert sum(v.shape == (256, 32) for v in model.trainable_variables) == 1
    assert "positions/table" in names  # learned, saved with the rest
    x = np.random.RandomState(0).randint(0, 256, (2, SEQ)).astype(np.int32)
    y = x.copy()
    y[:, 10] = (y[:, 10] + 1) % 256
    a, b = model(x).numpy(), model(y).numpy()
    assert a.shape == (2, SEQ, 256)
    np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-5)
    assert np.abs(a[:, :10] - b[:, :10]).max() == 0.0  # the past does not see the future
    assert np.abs(a[:, 10:] - b[:, 10:]).max() > 0.0


@pytest.mark.parametrize("spec, message", [
    ("transformer:depth=2", "model 'transformer:depth=2': transformer has no parameter "
     "'depth'; its parameters: layers (default 2), width (default 128), heads (default 4)"),
    ("transformer:layers=two", "model 'transformer:layers=two': layers='two' is not an "
     "integer; e.g. transformer:layers=2"),
])
def test_bad_model_parameters_are_named(spec, message):
    with pytest.raises(models.ModelError) as err:
        models.resolve(spec)
    assert str(err.value) == message


def test_transformer_trains_on_text_with_per_byte_accuracy(corpus_file, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the cut corpus goes there
    trainer = towers.Trainer(["/cpu:0", "/cpu:1"], model="transformer:layers=1,width=64,heads=2",
                             batch_size=16, learning_rate=3e-3,
                             data=towers.data.text(str(corpus_file), seq_len=32))
    assert trainer.options.data.seq_len == 32
    assert os.path.isdir(tmp_path / "tower-train")
    trainer.stream = io.StringIO()
    records = trainer.fit(epochs=3, steps_per_epoch=15)
    assert records[-1]["loss"] < records[0]["loss"] < np.log(256) + 0.5
    final = [line for line in trainer.stream.getvalue().splitlines() if line.startswith("15/15")]
    assert len(final) == 3 and all(" - sequences/s: " in line for line in final), final
    assert 0.0 < records[-1]["eval_accuracy"] < 1.0  # the fraction of bytes right
    assert records[-1]["eval_loss"] < np.log(256)
