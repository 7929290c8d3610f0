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

import tensorflow as tf

from engine.reducers.feedback import ErrorFeedback

# Python lists, not tensors: a tensor made on import would start TensorFlow
# before the devices are configured.
_BITS = [128, 64, 32, 16, 8, 4, 2, 1]
_SHIFTS = [7, 6, 5, 4, 3, 2, 1, 0]


def pack_signs(flat: tf.Tensor) -> tf.Tensor:
    """uint8[ceil(size / 8)]: bit 7 - j of byte i is 1 where flat[8 i + j] >= 0."""
    size = flat.shape.num_elements()
    padded = tf.pad(tf.cast(flat >= 0, tf.int32), [[0, -size % 8]])
    return tf.cast(tf.reduce_sum(tf.reshape(padded, [-1, 8]) * tf.constant(_BITS), axis=1), tf.uint8)


def unpack_signs(packed: tf.Tensor, size: int, dtype: tf.DType) -> tf.Tensor:
    """The +1 / -1 of `pack_signs`, `size` of them, in `dtype`."""
    bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(tf.cast(packed, tf.int32)[:, None], tf.constant(_SHIFTS)), 1
    )
    return tf.cast(2 * tf.reshape(bits, [-1])[:size] - 1, dtype)


class SignSGD(ErrorFeedback):
    """Scaled signs with error feedback, eight to a byte."""

    def __init__(self):
        super().__init__(name="signsgd")

    def compress(self, corrected):
        scale = tf.reduce_mean(tf.abs(corrected))
        packed = pack_signs(corrected)
        sent = scale * unpack_signs(packed, corrected.shape.num_elements(), corrected.dtype)
        return (packed, scale), sent

    def decompress(self, payloads, size):
        dtype = payloads[0][1].dtype
        return tf.add_n([scale * unpack_signs(packed, size, dtype) for packed, scale in payloads])

    def payload_bytes(self, shape, dtype):
        return -(-shape.num_elements() // 8) + dtype.size
