"""What a fixed-seed `deterministic=True` run of each built-in reducer gives,
as figures: the per-epoch losses, the bytes its placement log counts between
devices, and a digest of every tensor of its last checkpoint. Run by
tests/test_determinism.py in a process of its own (op determinism is
process-wide), and against `tests/data/determinism.json`, the figures
recorded from main before the run's plan was redesigned (2026-12-07):

    python tests/determinism.py MNIST_DIR OUT.json
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

import towers

# Each built-in reducer that runs on CPU towers (nccl needs GPUs), and the
# variables it runs with; auto chooses by the topology below, not by one
# fitted on this noisy machine.
RUNS = {
    "central": {},
    "ring": {},
    "tree": {},
    "hierarchical": {},
    "collective": {},
    "ring-replicated": {"reducer": "ring", "variables": "replicated"},
    "auto": {"reducer": "auto"},
    "topk": {"reducer": "topk:ratio=0.05"},
    "topk-dgc": {"reducer": "topk:ratio=0.05,momentum=0.9"},
    "powersgd": {"reducer": "powersgd:rank=2,start_after=0"},
    "signsgd": {"reducer": "signsgd"},
    "localsgd": {"reducer": "localsgd:every=2", "variables": "replicated"},
}


CPUS = [f"/cpu:{k}" for k in range(4)]
TOPOLOGY = {"name": "four-cpus", "hosts": [{"name": "host", "cores": 2, "devices": [
    {"name": d, "gamma": 1e-10, "op_seconds": 3e-06} for d in CPUS]}],
    "links": [{"src": CPUS, "dst": CPUS, "alpha": 1e-05, "beta": 1e-10}]}


def figures(mnist_dir: str, name: str, work: str) -> dict:
    """One run's figures: 2 epochs of 3 steps on 4 CPU towers."""
    import tensorflow as tf

    from engine.placement import report

    arguments = {"reducer": name, **RUNS[name]}
    if arguments["reducer"] == "auto":
        from engine.cost import topology

        arguments["topology"] = topology.loads(json.dumps(TOPOLOGY))
    log, checkpoints = os.path.join(work, f"{name}.jsonl"), os.path.join(work, name)
    trainer = towers.Trainer("cpu:4", model="mlp", optimizer="momentum", learning_rate=0.05,
                             data=towers.data.directory(mnist_dir), batch_size=16, seed=3,
                             deterministic=True, stream=open(os.devnull, "w"),  # noqa: SIM115
                             **arguments)
    history = trainer.fit(2, 3, eval_steps=2, placement_log=log, checkpoint_dir=checkpoints,
                          verbose=0)
    entries = towers.placement.load(log)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(checkpoints))
    digests = {}
    for key, dtype in sorted(reader.get_variable_to_dtype_map().items()):
        if (key.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "run/"))
                or dtype == tf.variant):
            # The object graph, the run's signature (it names the data's
            # folder, another in each test) and the readers' states (no
            # numpy form).
            continue
        value = reader.get_tensor(key)
        data = value.tobytes() if hasattr(value, "tobytes") else repr(value).encode()
        digests[key] = hashlib.sha256(data).hexdigest()[:16]
    return {
        "losses": [[r["loss"], r["eval_loss"]] for r in history],
        "bytes": {step: sum(t["bytes"] or 0 for t in report.transfers(entries, step))
                  for step in ("train", "eval")},
        "checkpoint": digests,
    }


# What the bits also depend on: a new Keras or numpy moves them (2026-12-08:
# every reducer's weights moved, its losses and bytes did not).
PACKAGES = ("tensorflow", "keras", "numpy", "nvidia-dali-cuda120")


def environment() -> dict:
    """The versions of PACKAGES here."""
    from importlib import metadata

    return {name: metadata.version(name) for name in PACKAGES}


def main(mnist_dir: str, out: str) -> None:
    with tempfile.TemporaryDirectory() as work:
        results = {name: figures(mnist_dir, name, work) for name in RUNS}
    results["_environment"] = environment()
    with open(out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
