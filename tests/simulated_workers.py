"""Sixteen workers simulated on this host's CPU (`cpu:16`), checked against
what sixteen devices would compute; run by tests/test_simulated_workers.py
in a process of its own (TensorFlow splits the CPU once per process).

    python tests/simulated_workers.py MODE MNIST_DIR OUT_DIR

MODE `mean`: sixteen towers of batch 8 with the exact mean, and one tower
fed the sixteen shards' batches concatenated (batch 128), from the same
weights; writes both runs' weights after three steps.
MODE `powersgd`: rank-2 PowerSGD on sixteen towers, three steps, a
checkpoint, and two more steps resumed in a new Trainer, against five steps
uninterrupted; writes every tower's residuals of both.
MODE `logs`: one step of rank-4 PowerSGD and of top-k at density 0.1% on
sixteen towers, each with its placement log.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import towers

WORKERS, BATCH = 16, 8
MODEL = "mlp:dropout=0.0"  # dropout would draw other masks on one tower than on sixteen
COMMON = dict(model=MODEL, optimizer="sgd", learning_rate=0.05, seed=0, deterministic=True,
              stream=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process


def shard_batches(trainer, steps: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """[step][tower]: the (images, labels) each tower's DALI shard gives
    first, read by iterators of its own made as the run makes them."""
    from engine.run.build import tower_iterators

    iterators = tower_iterators(trainer.options.data, trainer.placement, training=True)
    return [[tuple(t.numpy() for t in next(it)) for it in iterators] for _ in range(steps)]


def concatenated(batches, folder: str):
    """A pipeline function that gives one tower each step's sixteen batches
    as one: the samples written to `folder` in that order, one .npy file
    each, and read back in order by DALI's numpy reader."""
    os.makedirs(folder, exist_ok=True)
    names = []
    for t, step in enumerate(batches):
        for k, (images, labels) in enumerate(step):
            for i in range(len(images)):
                name = f"{t:02d}-{k:02d}-{i:02d}"
                np.save(os.path.join(folder, f"{name}.image.npy"), images[i])
                np.save(os.path.join(folder, f"{name}.label.npy"), labels[i])
                names.append(name)

    def feed(shard):
        from nvidia.dali import fn

        pipe = shard.pipeline()
        with pipe:
            read = [fn.readers.numpy(file_root=folder, random_shuffle=False,
                                     files=[f"{n}.{part}.npy" for n in names])
                    for part in ("image", "label")]
            pipe.set_outputs(*read)
        return pipe

    return towers.data.pipeline(feed, size=len(names))


def mean(mnist: str, out: str) -> None:
    data = towers.data.directory(mnist)
    sixteen = towers.Trainer(f"cpu:{WORKERS}", batch_size=BATCH, data=data, **COMMON)
    batches = shard_batches(sixteen, 3)
    sixteen._build(sixteen.options)
    start = sixteen.model.get_weights()
    sixteen.fit(epochs=1, steps_per_epoch=3, eval_steps=0, verbose=0)
    joined = concatenated(batches, os.path.join(out, "samples"))
    one = towers.Trainer("/cpu:0", batch_size=WORKERS * BATCH, data=joined, **COMMON)
    one._build(one.options)
    assert all(np.array_equal(a, b) for a, b in zip(start, one.model.get_weights()))
    one.fit(epochs=1, steps_per_epoch=3, eval_steps=0, verbose=0)
    np.savez(os.path.join(out, "mean.npz"), start=np.concatenate([w.ravel() for w in start]),
             sixteen=np.concatenate([w.ravel() for w in sixteen.model.get_weights()]),
             one=np.concatenate([w.ravel() for w in one.model.get_weights()]))


def residuals(trainer) -> np.ndarray:
    """[tower, every residual's entries] of the run's PowerSGD."""
    from engine.reducers.stateful import stateful_part

    state = stateful_part(trainer.built.step.reducer)
    return np.stack([np.concatenate([r.numpy().ravel() for r in tower])
                     for tower in state.residuals])


def powersgd(mnist: str, out: str) -> None:
    data = towers.data.directory(mnist)
    run = dict(batch_size=BATCH, data=data, reducer="powersgd:rank=2", variables="replicated",
               **COMMON)
    straight = towers.Trainer(f"cpu:{WORKERS}", **run)
    straight.fit(epochs=1, steps_per_epoch=5, eval_steps=0, verbose=0)
    checkpoints = os.path.join(out, "checkpoints")
    first = towers.Trainer(f"cpu:{WORKERS}", **run)
    first.fit(epochs=1, steps_per_epoch=3, eval_steps=0, verbose=0, checkpoint_dir=checkpoints)
    at_three = residuals(first)
    second = towers.Trainer(f"cpu:{WORKERS}", **run)
    second.fit(epochs=1, steps_per_epoch=5, eval_steps=0, verbose=0,
               checkpoint_dir=checkpoints, resume=True)
    np.savez(os.path.join(out, "powersgd.npz"), straight=residuals(straight),
             at_three=at_three, resumed=residuals(second))


def logs(mnist: str, out: str) -> None:
    """One step of each compressing reducer the bytes test prices, with its
    placement log."""
    for reducer in ("powersgd:rank=4", "topk:ratio=0.001"):
        trainer = towers.Trainer(f"cpu:{WORKERS}", batch_size=BATCH, reducer=reducer,
                                 variables="replicated", data=towers.data.directory(mnist),
                                 **COMMON)
        trainer.fit(epochs=1, steps_per_epoch=1, eval_steps=0, verbose=0,
                    placement_log=os.path.join(out, f"{reducer}.jsonl"))


if __name__ == "__main__":
    mode, mnist_dir, out_dir = sys.argv[1:]
    {"mean": mean, "powersgd": powersgd, "logs": logs}[mode](mnist_dir, out_dir)
