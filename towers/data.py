"""Where a Trainer's batches come from: real MNIST, a data directory,
DALI-generated images, or your own DALI pipeline.

Each function returns a `Source`; a `Trainer` turns it into one DALI pipeline
per tower, reading that tower's shard on its device. `pipeline(fn)` takes a
function of a `Shard` (the tower's index, the shard count, DALI's device_id or
None, a seed, the batch size, the split) that returns a DALI pipeline of
(images, labels); the built-in formats are such functions too.

Example:

    from nvidia.dali import fn, types
    import towers

    def noise(shard: towers.data.Shard):
        pipe = shard.pipeline()
        with pipe:
            images = fn.random.uniform(range=[0.0, 1.0], shape=[28, 28, 1])
            labels = fn.random.uniform(values=list(range(10)), dtype=types.INT32, shape=[1])
            pipe.set_outputs(images, labels)
        return pipe

    trainer = towers.Trainer("cpu:2", data=towers.data.pipeline(noise))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

from engine.data.inspect import DataError, DatasetInfo
from engine.data.pipeline import PIPELINE_CONTRACT, SHARD_EXAMPLE, Shard
from engine.userfn import check_signature, label, load_function

__all__ = ["DEFAULT_MNIST", "Shard", "Source", "directory", "mnist", "pipeline", "synthetic",
           "text"]

def _cache() -> str:
    """Where prepared data is kept: ~/.cache/tower-train (or $XDG_CACHE_HOME's)."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "tower-train")


DEFAULT_MNIST = os.path.join(_cache(), "mnist")
"""Where `mnist()` keeps the real digits: ~/.cache/tower-train/mnist (or under
$XDG_CACHE_HOME), prepared on first use."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Data for a Trainer; made by `mnist`, `directory`, `synthetic`, `text` or `pipeline`.

    Attributes:
      kind: `mnist`, `directory`, `synthetic`, `text` or `pipeline`.
      path: the data directory (mnist, directory).
      format: `auto`, `caffe2`, `folder`, `jpeg` or `tfrecord` (directory);
        `caffe2`, `jpeg` or `tfrecord` (mnist).
      function: the pipeline function (pipeline).
      image_shape: (height, width, channels) of the images; None (mnist,
        directory, synthetic): the model's `default_input_shape`, else as
        stored (28 x 28 x 1 for MNIST and synthetic data).
      num_classes: labels are in [0, num_classes) (synthetic, pipeline, and
        directories of TFRecords without meta.json); None: from the data.
      samples: a fixed set of this many samples (synthetic); None: every
        sample new.
      size: training samples (pipeline; None: unknown, epochs of 100 steps).
      val_size: held-out samples the function reads with `training=False`
        (pipeline; None: no held-out set).
      corpus: the text file (text; None: the standard library's sources).
      seq_len: bytes per sequence (text).
    """

    kind: str
    path: str | None = None
    format: str = "auto"
    function: Callable | None = None
    image_shape: tuple[int, int, int] | None = None
    num_classes: int | None = None
    samples: int | None = None
    size: int | None = None
    val_size: int | None = None
    corpus: str | None = None
    seq_len: int | None = None

    @property
    def is_prepared(self) -> bool:
        """False only for MNIST that is still to be downloaded and written."""
        from engine.data import mnist as mnist_lib
        from engine.data import text as text_lib

        if self.kind == "text":
            return text_lib.is_prepared(self.path, self.seq_len, self.corpus)
        return self.kind != "mnist" or mnist_lib.is_prepared(self.path)

    def inspect(self, say: Callable[[str], None] = print) -> DatasetInfo:
        """What the source holds; prepares MNIST first when it is not there yet.

        Args:
          say: prints one line of MNIST's preparation.

        Raises:
          DataError: a directory that is not a data set, naming it and why.
          SourceError: MNIST could not be fetched.
        """
        from engine import data as data_lib

        if self.kind == "synthetic":
            return DatasetInfo("synthetic", None, None, None, None, self.num_classes or 10)
        if self.kind == "pipeline":
            name = label(self.function)
            return DatasetInfo("pipeline", name, name if self.val_size else None,
                               self.size, self.val_size, self.num_classes)
        if self.kind == "text" and not self.is_prepared:
            from engine.data import text as text_lib

            say(f"cutting {self.corpus or 'the standard library sources'} into sequences of "
                f"{self.seq_len} bytes in {self.path}")
            text_lib.prepare(self.path, self.corpus, self.seq_len, log=lambda m: say(f"  {m}"))
        if self.kind == "text":
            return data_lib.inspect(self.path, "text")
        if not self.is_prepared:
            from engine.data import mnist as mnist_lib

            flag = "" if self.format == "caffe2" else f" --format {self.format}"
            say(f"no MNIST in {self.path} yet; preparing it "
                f"(the same as: tower-data mnist {self.path}{flag})")
            mnist_lib.prepare(self.path, log=lambda m: say(f"  {m}"), format=self.format)
        return data_lib.inspect(self.path, self.format, self.num_classes)


def mnist(path: str | None = None, format: str = "caffe2") -> Source:
    """Real MNIST, 60,000 training and 10,000 held-out digits.

    Args:
      path: where it is kept; default `~/.cache/tower-train/mnist` (with
        `-jpeg` or `-tfrecord` after it for those formats). Prepared there
        on first use (the same as `tower-data mnist PATH --format FORMAT`).
      format: `caffe2` (LMDB), `jpeg` (class folders and file lists) or
        `tfrecord` (ImageNet-format TFRecords).

    Returns:
      The source.

    Raises:
      DataError: an unknown format.
    """
    from engine.data.mnist import FORMATS

    if format not in FORMATS:
        raise DataError(f"<format> {format!r} is not one of {', '.join(FORMATS)}")
    default = DEFAULT_MNIST if format == "caffe2" else f"{DEFAULT_MNIST}-{format}"
    return Source("mnist", path=path or default, format=format)


def directory(path: str, format: str = "auto", num_classes: int | None = None) -> Source:
    """A data directory: LMDB databases, class folders, JPEGs with file lists,
    or TFRecords (engine.data.inspect describes each layout).

    Args:
      path: the directory.
      format: `caffe2` (LMDB), `folder` (one sub-folder per class), `jpeg`
        (class folders or `train.txt`/`val.txt` file lists, augmented),
        `tfrecord` (ImageNet-format TFRecords, augmented; missing DALI
        index files are made) or `auto`.
      num_classes: for TFRecords without a meta.json saying it; None: from
        the data.

    Returns:
      The source; it is checked when a Trainer is made.

    Raises:
      DataError: an unknown format.
    """
    from engine.data.inspect import STORED_FORMATS

    if format not in ("auto", *STORED_FORMATS):
        raise DataError(
            f"<format> {format!r} is not one of auto, {', '.join(STORED_FORMATS)}"
        )
    if num_classes is not None and num_classes < 1:
        raise DataError(f"<num_classes> ({num_classes}) must be at least 1")
    return Source("directory", path=path, format=format, num_classes=num_classes)


def synthetic(image_shape: Sequence[int] | None = None, num_classes: int = 10,
              samples: int | None = None) -> Source:
    """Images generated by DALI on each tower, no files: random labels, each
    image its class's fixed pattern plus noise, so that a model can learn them.

    Args:
      image_shape: (height, width, channels); None: the model's
        `default_input_shape`, else 28 x 28 x 1.
      num_classes: labels are in [0, num_classes).
      samples: None, or a fixed set of this many samples (labels drawn once,
        images without noise) that every step draws from: data a model can
        memorise, so that a few steps show a falling loss even with many
        classes (tf_cnn_benchmarks' synthetic data is one fixed batch).

    Returns:
      The source.

    Raises:
      DataError: num_classes or samples below 1.
    """
    from engine.data.pipeline import check_synthetic_samples

    if num_classes < 1:
        raise DataError(f"<num_classes> ({num_classes}) must be at least 1")
    check_synthetic_samples(samples, "synthetic")
    return Source("synthetic", image_shape=None if image_shape is None else tuple(image_shape),
                  num_classes=num_classes, samples=samples)


def pipeline(
    function: Callable[[Shard], object] | str,
    *,
    image_shape: Sequence[int] = (28, 28, 1),
    num_classes: int = 10,
    size: int | None = None,
    val_size: int | None = None,
) -> Source:
    """Your own DALI pipeline, one per tower.

    Args:
      function: called once per tower and split with a `Shard`; returns an
        `nvidia.dali.Pipeline` whose outputs are images [H, W, C] float32 and
        labels [1] int32 per sample (on the GPU when `shard.device_id` is
        set). `shard.pipeline()` makes the empty pipeline with the shard's
        batch size, threads, device and seed; `shard.reader_arguments()`
        gives a DALI reader its shard. Or `package.module:function`.
      image_shape: (height, width, channels) of the images.
      num_classes: labels are in [0, num_classes).
      size: training samples, for the default epoch length; None: 100 steps.
      val_size: held-out samples; the function is then also called with
        `shard.training` False and must read them in order, padded as
        `reader_arguments` does. None: no held-out set.

    Returns:
      The source.

    Raises:
      UserCodeError: `function` cannot be called with one Shard.
    """
    if isinstance(function, str):
        function = load_function(function, "pipeline")
    check_signature(function, "pipeline", PIPELINE_CONTRACT, SHARD_EXAMPLE)
    return Source("pipeline", function=function, image_shape=tuple(image_shape),
                  num_classes=num_classes, size=size, val_size=val_size)


def text(corpus: str | None = None, seq_len: int = 128) -> Source:
    """A byte-level text corpus for a language model (`transformer`).

    Each sample is `seq_len` bytes and the `seq_len` bytes that follow each of
    them; the last 5% of the corpus is held out. It is cut once into
    TFRecords under `~/.cache/tower-train/text-...` and read by DALI, one
    shard per tower, like any other data.

    Args:
      corpus: a text file; None: the Python standard library's own sources
        (every `*.py` outside test folders, in sorted order), there offline.
      seq_len: bytes per sequence.

    Returns:
      The source.

    Raises:
      DataError: a corpus that is not a file, or a seq_len below 2.
    """
    import hashlib

    if seq_len < 2:
        raise DataError(f"<seq_len> ({seq_len}) must be at least 2")
    if corpus is None:
        name = "stdlib"
    elif not os.path.isfile(corpus):
        raise DataError(f"<path> {corpus!r} is not a text file")
    else:
        stem = os.path.splitext(os.path.basename(corpus))[0]
        name = f"{stem}-{hashlib.sha256(os.path.abspath(corpus).encode()).hexdigest()[:8]}"
    return Source("text", path=os.path.join(_cache(), f"text-{name}-{seq_len}"), format="text",
                  num_classes=256, corpus=corpus, seq_len=seq_len)

