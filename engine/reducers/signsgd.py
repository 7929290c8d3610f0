"""signsgd: EF-signSGD (Karimireddy et al., "Error Feedback Fixes SignSGD and
other Gradient Compression Schemes", ICML 2019).

Each tower adds its residual to its gradient, p = g + e, and sends the sign
of every entry scaled by the mean magnitude, (|p|_1 / d) sign(p): the signs
packed eight to a uint8 (a zero counts as +), and one scale per tensor in the
gradient's dtype. The residual keeps p minus what was sent
(engine.reducers.feedback). Packed signs cannot be summed on the way, so
they are all-gathered and every destination unpacks the N towers' signs,
scales and averages them.

Bytes per step, N towers that are all destinations (replicated variables),
float32 gradients of sizes s_v:

    each tower sends ceil(s_v / 8) + 4 bytes per gradient to each of the
    N - 1 others: total = N (N - 1) sum_v (ceil(s_v / 8) + 4)

A dense ring sends 2 (N - 1) 4 sum_v s_v, so signs move about N / 64 of it:
6.25% on 4 towers (mlp: 152,856 bytes against 2,442,480).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine.reducers.feedback import ErrorFeedback

# Bits of a byte, most significant first. No int32 on the way: TensorFlow does
# int32 work in host memory on a GPU, which would copy every tensor out of the
# GPU and back. Packing adds weighted 0/1 floats (exact up to 255); unpacking
# shifts the uint8 bytes.
_WEIGHTS = [128.0, 64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0]
_SHIFTS = [7, 6, 5, 4, 3, 2, 1, 0]


def pack_signs(flat: tf.Tensor) -> tf.Tensor:
    """uint8[ceil(size / 8)]: bit 7 - j of byte i is 1 where flat[8 i + j] >= 0."""
    size = flat.shape.num_elements()
    bits = tf.pad(tf.cast(flat >= 0, tf.float32), [[0, -size % 8]])
    weights = tf.constant(_WEIGHTS)  # made here: a tensor made on import would start TensorFlow
    return tf.cast(tf.reduce_sum(tf.reshape(bits, [-1, 8]) * weights, axis=1), tf.uint8)


def unpack_signs(packed: tf.Tensor, size: int, dtype: tf.DType) -> tf.Tensor:
    """The +1 / -1 of `pack_signs`, `size` of them, in `dtype`."""
    shifted = tf.bitwise.right_shift(packed[:, None], tf.constant(_SHIFTS, tf.uint8))
    bits = tf.bitwise.bitwise_and(shifted, tf.constant(1, tf.uint8))
    return tf.cast(2.0 * tf.cast(tf.reshape(bits, [-1])[:size], tf.float32) - 1.0, dtype)


class SignSGD(ErrorFeedback):
    """Scaled signs with error feedback, eight to a byte.

    Args:
      feedback: keep what the signs did not carry for the next step
        (EF-signSGD); False is scaled signSGD, the paper's ablation.
    """

    def __init__(self, feedback: bool = True):
        super().__init__(name="signsgd", feedback=feedback)

    def compress(self, corrected: tf.Tensor) -> tuple[tuple[tf.Tensor, ...], tf.Tensor]:
        scale = tf.reduce_mean(tf.abs(corrected))
        packed = pack_signs(corrected)
        sent = scale * unpack_signs(packed, corrected.shape.num_elements(), corrected.dtype)
        return (packed, scale), sent

    def decompress(self, payloads: Sequence[tuple[tf.Tensor, ...]], size: int) -> tf.Tensor:
        dtype = payloads[0][1].dtype
        return tf.add_n([scale * unpack_signs(packed, size, dtype) for packed, scale in payloads])

    def payload_bytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int:
        return -(-shape.num_elements() // 8) + dtype.size
