"""A small decoder-only Transformer language model over bytes.

Byte embedding plus a learned position embedding, `layers` pre-norm blocks
(causal multi-head self-attention, then a GELU MLP of 4 x width, each added
back to the residual stream), a final layer norm, and the output tied to the
byte embedding (GPT-2's layout at toy size). It maps a batch of byte
sequences [B, T] (int32) to next-byte probabilities [B, T, 256]; the loss is
the cross-entropy per byte, and `loss / ln 2` is bits per byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keras imports TensorFlow: only once a model is built
    import keras

__all__ = ["BYTES", "transformer"]

BYTES = 256


def _tied_embedding(width: int):
    """A byte embedding whose transpose is also the output layer."""
    import keras

    class TiedEmbedding(keras.layers.Layer):
        def build(self, input_shape):
            self.embeddings = self.add_weight(
                shape=(BYTES, width), initializer=keras.initializers.RandomNormal(stddev=0.02),
                name="embeddings")

        def call(self, inputs, logits=False):
            if logits:  # [B, T, width] -> [B, T, 256]
                table = keras.ops.cast(self.embeddings, inputs.dtype)
                return keras.ops.matmul(inputs, keras.ops.transpose(table))
            return keras.ops.take(keras.ops.cast(self.embeddings, self.compute_dtype),
                                  inputs, axis=0)

    return TiedEmbedding(name="bytes")


def _positions(length: int, width: int):
    """A learned position embedding added to the byte embedding."""
    import keras

    class PositionEmbedding(keras.layers.Layer):
        def build(self, input_shape):
            self.table = self.add_weight(
                shape=(length, width), initializer=keras.initializers.RandomNormal(stddev=0.02),
                name="table")

        def call(self, inputs):
            return inputs + keras.ops.cast(self.table, inputs.dtype)[None]

    return PositionEmbedding(name="positions")


def _block(x, width: int, heads: int, index: int):
    import keras

    y = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{index}_norm1")(x)
    y = keras.layers.MultiHeadAttention(heads, width // heads, name=f"block{index}_attention")(
        y, y, use_causal_mask=True)
    x = keras.layers.Add()([x, y])
    y = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{index}_norm2")(x)
    y = keras.layers.Dense(4 * width, activation="gelu", name=f"block{index}_up")(y)
    y = keras.layers.Dense(width, name=f"block{index}_down")(y)
    return keras.layers.Add()([x, y])


def transformer(input_shape=(128,), num_classes: int = BYTES, *, layers: int = 2,
                width: int = 128, heads: int = 4) -> keras.Model:
    """A decoder-only byte-level language model.

    Args:
      input_shape: (sequence length,).
      num_classes: must be 256 (bytes).
      layers: Transformer blocks.
      width: the residual stream's width; a multiple of `heads`.
      heads: attention heads per block.

    Returns:
      The model: int32 bytes [B, T] to next-byte probabilities [B, T, 256].

    Raises:
      ValueError: a shape or size that cannot be built.
    """
    import keras

    if num_classes != BYTES or len(tuple(input_shape)) != 1:
        raise ValueError(
            f"transformer models byte sequences: input_shape (T,) and 256 classes, got "
            f"input_shape {tuple(input_shape)} and {num_classes} classes; train it on text "
            "(--data-format text)")
    if width % heads:
        raise ValueError(f"width ({width}) must be a multiple of heads ({heads})")
    (length,) = tuple(input_shape)
    tokens = keras.Input((length,), dtype="int32")
    embedding = _tied_embedding(width)
    x = _positions(length, width)(embedding(tokens))
    for index in range(layers):
        x = _block(x, width, heads, index)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    logits = embedding(x, logits=True)
    probabilities = keras.layers.Activation("softmax", dtype="float32", name="next_byte")(logits)
    return keras.Model(tokens, probabilities, name="transformer")


transformer.default_input_shape = (128,)
