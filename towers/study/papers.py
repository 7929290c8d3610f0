"""The compression papers' comparison as named studies: 16 workers, every
method the papers set side by side, two tasks this machine has offline.

    tower-compare --study papers-lenet --out papers-lenet
    towers.compare(**towers.study.papers.STUDIES["papers-resnet20"].arguments(), out=...)

The methods are those of PowerSGD (Vogels et al., NeurIPS 2019, Table 3:
SGD and ranks 1, 2, 4), Deep Gradient Compression (Lin et al., ICLR 2018:
top-k with momentum correction), EF-signSGD (Karimireddy et al., ICML 2019:
signSGD with and without error feedback) and local SGD (Stich, ICLR 2019),
each with SGD with momentum 0.9 as the papers train, except DGC, whose
momentum is the reducer's (plain SGD after it). The time is predicted on
two 16-GPU machines: two 8-GPU hosts on 10 Gb/s Ethernet (the network the
papers measured on) and on 100 Gb/s InfiniBand.
"""

from __future__ import annotations

import dataclasses

from towers.study.study import Method

__all__ = ["METHODS", "STUDIES", "TOPOLOGIES", "NamedStudy"]

# Two hosts of 8 GPUs: 16 workers.
TOPOLOGIES = ("2x8-ethernet-10g:16", "2x8-infiniband-100g:16")
WORKERS = 16

METHODS = (
    Method("ring", label="SGD (exact mean)"),
    Method("powersgd:rank=1", label="PowerSGD rank 1"),
    Method("powersgd:rank=2", label="PowerSGD rank 2"),
    Method("powersgd:rank=4", label="PowerSGD rank 4"),
    Method("topk:ratio=0.01", label="top-k 1%, EF"),
    Method("topk:ratio=0.001", label="top-k 0.1%, EF"),
    Method("topk:ratio=0.01,momentum=0.9", label="DGC 1%", trainer={"optimizer": "sgd"}),
    Method("topk:ratio=0.001,momentum=0.9", label="DGC 0.1%", trainer={"optimizer": "sgd"}),
    Method("signsgd", label="EF-signSGD"),
    Method("signsgd:feedback=false", label="signSGD, no EF"),
    Method("localsgd:every=4", label="local SGD, 4"),
    Method("localsgd:every=16", label="local SGD, 16"),
)
"""Every method of the papers' tables, the exact mean first."""


@dataclasses.dataclass(frozen=True)
class NamedStudy:
    """A study by name: its methods, workload and scale.

    Attributes:
      name: what `--study` takes.
      summary: one line on what it trains.
      model: the model zoo's name.
      data: `mnist-jpeg` (the real MNIST as JPEG files) or `text` (the
        default corpus).
      batch_size: per worker.
      learning_rate: the momentum SGD's rate.
      epochs: epochs per run.
      steps_per_epoch: steps per epoch; None: one pass over the data.
      eval_steps: held-out batches per worker after each epoch.
      seeds: runs per method.
      compute_ms: a worker's compute per step on the predicted machines'
        GPUs, in ms; None: the step measured here, shared by the workers.
    """

    name: str
    summary: str
    model: str
    data: str
    batch_size: int
    learning_rate: float
    epochs: int
    steps_per_epoch: int | None
    eval_steps: int | None
    seeds: int = 3
    compute_ms: float | None = None

    def arguments(self, gpu: bool | None = None) -> dict:
        """`towers.compare`'s arguments, but `out`: 16 workers on GPU 0
        (`gpu:16`) where there is a GPU, else on the CPU (`cpu:16`).

        Args:
          gpu: put the workers on GPU 0; None: where TensorFlow sees one
            (asks it, which starts it).

        Returns:
          The keyword arguments, `reducers` the twelve METHODS.
        """
        import towers

        if gpu is None:
            import tensorflow as tf

            gpu = bool(tf.config.list_physical_devices("GPU"))
        data = (towers.data.text() if self.data == "text"
                else towers.data.mnist(format="jpeg"))
        compute = "" if self.compute_ms is None else f":{self.compute_ms:g}"
        return dict(reducers=list(METHODS), seeds=self.seeds,
                    topologies=[f"{t}{compute}" for t in TOPOLOGIES],
                    epochs=self.epochs, steps_per_epoch=self.steps_per_epoch,
                    eval_steps=self.eval_steps, devices=f"{'gpu' if gpu else 'cpu'}:{WORKERS}",
                    model=self.model, data=data, batch_size=self.batch_size,
                    optimizer="momentum", learning_rate=self.learning_rate,
                    variables="replicated")


STUDIES = {study.name: study for study in (
    NamedStudy(name="papers-resnet20", model="resnet20", data="mnist-jpeg", batch_size=16,
               learning_rate=0.05, epochs=4, steps_per_epoch=None, eval_steps=None,
               compute_ms=3.8,  # one H100, batch 128, XLA (2026-12-07): a worker's at most
               summary="ResNet-20 on the real MNIST as JPEGs, one pass an epoch "
                       "(234 steps, 16 digits a worker)"),
    NamedStudy(name="papers-transformer", model="transformer", data="text", batch_size=8,
               learning_rate=0.05, epochs=4, steps_per_epoch=200, eval_steps=20,
               compute_ms=3.0,  # one H100, batch 128, XLA (2026-12-07): a worker's at most
               summary="the Transformer on the default text corpus (the standard "
                       "library's sources), byte level"),
    NamedStudy(name="papers-lenet", model="lenet", data="mnist-jpeg", batch_size=8,
               learning_rate=0.05, epochs=2, steps_per_epoch=60, eval_steps=8,
               summary="LeNet on the real MNIST as JPEGs, 2 short epochs: the papers' "
                       "methods at a scale this machine's CPU runs in under an hour"),
)}
"""The named studies, by the name `--study` takes."""
