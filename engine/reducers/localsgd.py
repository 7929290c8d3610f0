"""localsgd: local SGD with periodic averaging (Stich, "Local SGD Converges
Fast and Communicates Little", ICLR 2019; Lin et al., "Don't Use Large
Mini-Batches, Use Local SGD", ICLR 2020).

With replicated variables, each tower applies its own gradient to its own
replica: the call moves nothing and hands every tower its own gradients.
After the update of every `every`-th step the replicas' floating-point
variables (weights, non-trainable statistics and the optimizer's slots) are
averaged by ring all-reduce, so the replicas agree right after such a step
(`check_replicas` checks there). Variables on the reduce device leave no
replica to step alone: refused.

Bytes, N towers, V bytes of floating-point replica variables per tower
(mlp with Adam: weights and two slots, 3 x 407,080 bytes):

    on an averaging step: 2 (N - 1) V in all (ring); on the others: none

A dense ring sends 2 (N - 1) P every step (P: gradient bytes), so local SGD
moves V / (P every) of it on average: 3/8 with Adam and every = 8. Both
branches of the averaging are in the step's graph, so the placement log,
which reads the graph, shows the averaging step's figure.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from engine import scopes
from engine.reducers.base import ReducerError
from engine.reducers.primitives import all_reduce
from engine.reducers.stateful import ReducerContext, StatefulReducer


class LocalSGD(StatefulReducer):
    """Each tower steps alone; the replicas are averaged every `every` steps.

    Args:
      every: steps between averagings, at least 1.

    Raises:
      ReducerError: `every` below 1; at build, variables on the reduce device.
    """

    lossy = True

    def __init__(self, every: int = 8):
        super().__init__(name="localsgd")
        if every < 1:
            raise ReducerError(f"<reducer> localsgd: every ({every}) must be at least 1")
        self.every = every

    def build(self, context: ReducerContext) -> None:
        if context.variables != "replicated" or list(context.destinations) != list(context.devices):
            raise ReducerError(
                "<reducer=localsgd> <variables=reduce-device>: local SGD steps each "
                "tower's own replica; add <variables=replicated>"
            )
        self.context = context

    @property
    def step_note(self) -> str:
        """When `step_bytes` are sent."""
        return f"on an averaging step, 1 in every {self.every}"

    def __call__(self, tower_grads, devices, destinations):
        out = []
        for destination in destinations:
            k = list(devices).index(destination)
            with tf.device(destination), tf.name_scope(scopes.REDUCE):
                out.append([tf.identity(g) for g in tower_grads[k]])
        return out

    def after_update(self) -> None:
        context = self.context
        if not context.replicas or context.step is None:
            return
        due = tf.equal((context.step.read_value() + 1) % self.every, 0)

        def average():
            with tf.name_scope(scopes.REDUCE):
                for replicas in zip(*context.replicas):
                    reads = []
                    for variable, device in zip(replicas, context.devices):
                        with tf.device(device):
                            reads.append(tf.convert_to_tensor(variable))  # a Keras variable too
                    for variable, device, mean in zip(
                        replicas, context.devices, all_reduce(reads, context.devices)
                    ):
                        with tf.device(device):
                            variable.assign(mean)
            return tf.constant(True)

        tf.cond(due, average, lambda: tf.constant(False))

    def traffic(self, devices: Sequence[str], destinations: Sequence[str],
                nbytes: int) -> dict[str, int]:
        """The call itself sends nothing (`step_bytes` is what averaging sends).

        Args:
          devices: the towers' devices, in order.
          destinations: where the mean goes (every tower, or the reduce device).
          nbytes: the gradient's bytes (unused: the built context knows them).
        """
        return {}

    def step_bytes(self) -> int | None:
        """Bytes of an averaging step: a ring all-reduce of every replica variable."""
        if self.context is None or not self.context.replicas:
            return None
        n = len(self.context.devices)
        size = sum(tf.TensorShape(v.shape).num_elements() * tf.as_dtype(v.dtype).size
                   for v in self.context.replicas[0])  # Keras variables: tuple, str
        return 2 * (n - 1) * size
