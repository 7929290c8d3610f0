"""Reducers for `towers.Trainer(reducer=...)`: the built-ins with state, the
base class and collectives to write your own, and the conformance kit.

A reducer is a name (`"ring"`, `"topk:ratio=0.05"`), a function of
(tower_grads, devices, destinations), or an object such as `TopK(ratio=0.05)`
or your own `StatefulReducer`:

    import tensorflow as tf
    import towers
    from towers.reducers import StatefulReducer, all_gather

    class Int8Feedback(StatefulReducer):
        lossy = True  # one call approximates the mean; error feedback repays it

        def build(self, context):
            self.residuals = []
            for device in context.devices:
                with tf.device(device):
                    self.residuals.append([tf.Variable(tf.zeros(s, d), trainable=False)
                                           for s, d in zip(context.shapes, context.dtypes)])

        def __call__(self, tower_grads, devices, destinations):
            ...  # quantise gradient + residual, keep what was lost, all_gather

    towers.Trainer("cpu:4", reducer=Int8Feedback(), variables="replicated")

The state is saved in every checkpoint and restored by `fit(resume=True)`.
"""

from engine.reducers import BUILT_INS, parameters
from engine.reducers.conformance import ReducerTestBase, check
from engine.reducers.localsgd import LocalSGD
from engine.reducers.powersgd import PowerSGD
from engine.reducers.primitives import (
    ALGORITHMS,
    all_gather,
    all_reduce,
    broadcast,
    reduce_scatter,
)
from engine.reducers.signsgd import SignSGD
from engine.reducers.stateful import ReducerContext, StatefulReducer
from engine.reducers.topk import TopK

__all__ = [
    "ALGORITHMS",
    "BUILT_INS",
    "LocalSGD",
    "PowerSGD",
    "ReducerContext",
    "ReducerTestBase",
    "SignSGD",
    "StatefulReducer",
    "TopK",
    "all_gather",
    "all_reduce",
    "broadcast",
    "check",
    "parameters",
    "reduce_scatter",
]
