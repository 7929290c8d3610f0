"""A user's own reducer, loaded by the CLI tests as tests.user_reducers:gather_on_first.

The contract (docs: Guides, Reducers): take every tower's gradients and
devices, return the mean for each destination device, placed there.
"""

# --8<-- [start:imports]
import tensorflow as tf

from towers.reducers import StatefulReducer, all_gather

# --8<-- [end:imports]


# --8<-- [start:gather]
def gather_on_first(tower_grads, devices, destinations):
    """Average on the first tower's device, then copy to each destination."""
    with tf.device(devices[0]):
        means = [tf.add_n(list(grads)) / len(devices) for grads in zip(*tower_grads)]
    out = []
    for destination in destinations:
        with tf.device(destination):
            out.append([tf.identity(m) for m in means])
    return out
# --8<-- [end:gather]


def summed(tower_grads, devices, destinations):
    """Wrong on purpose: the sum of the towers' gradients, not their mean."""
    with tf.device(devices[0]):
        sums = [tf.add_n(list(grads)) for grads in zip(*tower_grads)]
    out = []
    for destination in destinations:
        with tf.device(destination):
            out.append([tf.identity(s) for s in sums])
    return out


def two_arguments(tower_grads, devices):
    """Wrong on purpose: the contract passes destinations too."""
    return [list(tower_grads[0])]


def raises(tower_grads, devices, destinations):
    """Wrong on purpose: fails while the step is traced."""
    raise ValueError("no reduction for you")


# --8<-- [start:int8]
class Int8Feedback(StatefulReducer):
    """A user's stateful reducer (docs: Guides, Reducers with state): each tower
    sends its gradient plus its residual rounded to int8 with one float scale
    per tensor, keeps what the rounding lost, and every destination averages
    the towers' dequantised tensors."""

    lossy = True

    def build(self, context):
        self.context = context
        self.residuals = []
        for device in context.devices:
            with tf.device(device):
                self.residuals.append([tf.Variable(tf.zeros(shape, dtype), trainable=False)
                                       for shape, dtype in zip(context.shapes, context.dtypes)])

    def __call__(self, tower_grads, devices, destinations):
        out = [[] for _ in destinations]
        for v, grads in enumerate(zip(*tower_grads)):
            codes, scales = [], []
            for k, (grad, device) in enumerate(zip(grads, devices)):
                with tf.device(device):
                    corrected = grad + self.residuals[k][v]
                    scale = tf.reduce_max(tf.abs(corrected)) / 127
                    code = tf.cast(tf.round(tf.math.divide_no_nan(corrected, scale)), tf.int8)
                    self.residuals[k][v].assign(corrected - tf.cast(code, grad.dtype) * scale)
                codes.append(code)
                scales.append(scale)
            for d, (code_d, scale_d) in enumerate(zip(all_gather(codes, devices, destinations),
                                                      all_gather(scales, devices, destinations))):
                with tf.device(destinations[d]):
                    dequantised = [tf.cast(c, grads[0].dtype) * s for c, s in zip(code_d, scale_d)]
                    out[d].append(tf.add_n(dequantised) / len(devices))
        return out
# --8<-- [end:int8]
