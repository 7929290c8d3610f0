"""Which data a model reads: a zoo model refused on data it cannot read, and
the image shape a run decodes to for it."""

from __future__ import annotations

from engine.errors import UsageError
from towers import models


def check_pairing(model, source, info) -> None:
    """Refuses a zoo model on data it cannot read (an image model on text, the
    transformer on images), before anything is built.

    Raises:
      UsageError: naming the model and the data, and what would pair.
    """
    reads = models.input_kind(model)
    text = (info.format if info is not None else source.kind) == "text"
    if reads is None or (reads == "sequences") == text:
        return
    name = models.model_name(model)
    if text:
        raise UsageError(
            f"<model={name}> reads images; text feeds a sequence model such as "
            "<model=transformer>"
        )
    raise UsageError(f"<model={name}> reads byte sequences; add <format=text>")


def image_shape(source, info, model, image_size: int | None) -> tuple[int, int, int]:
    """The (height, width, channels) a run decodes images to: the source's
    own shape, else the default of `model` (as the Trainer takes it), else as
    the data is stored, else 28 x 28 x 1; `image_size` then sets height and
    width."""
    shape = (source.image_shape or models.default_input_shape(model) or info.image_shape
             or (28, 28, 1))
    if image_size is not None:
        shape = (image_size, image_size, shape[2])
    return tuple(shape)



def check_image_size(image_size: int | None, source) -> None:
    """`image_size` sizes images a run decodes itself: not text, not a
    pipeline of the user's own."""
    if image_size is not None and source.kind == "text":
        raise UsageError(f"<image_size={image_size}> sizes images; text comes in "
                         "sequences of <seq_len> bytes (towers.data.text)")
    if image_size is not None and source.kind == "pipeline":
        raise UsageError(
            f"<image_size={image_size}>: a <pipeline> decodes to its own "
            "image_shape (towers.data.pipeline); drop <image_size>"
        )
