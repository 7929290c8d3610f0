"""tower-train's Python API: explicit towers, one DALI shard each, the reduction you choose.

    import towers
    trainer = towers.Trainer("cpu:2", model="lenet", reducer="ring")
    history = trainer.fit(epochs=2)

`towers.data` holds the data sources (MNIST, directories, synthetic images,
your own DALI pipeline), `towers.models` the model zoo, `towers.reducers`
the reducers with state and what you need to write your own,
`towers.placement` what reads a placement log (summary, trace, budgets),
`towers.cost` the cost model (topologies, predictions). The command-line tools
in `towers.cli` are thin layers over this API.
"""

from engine.errors import RunError, TowerError, UsageError
from engine.userfn import UserCodeError
from towers import data, models, placement
from towers.data import Shard
from towers.trainer import Trainer

__all__ = [
    "RunError",
    "Shard",
    "TowerError",
    "Trainer",
    "UsageError",
    "UserCodeError",
    "cost",
    "data",
    "models",
    "placement",
    "reducers",
]


def __getattr__(name):
    # towers.reducers and towers.cost import TensorFlow, which the CLI
    # configures (its log level, its devices) before importing it: load them
    # on first use.
    if name in ("reducers", "cost"):
        import importlib

        return importlib.import_module(f"towers.{name}")
    raise AttributeError(f"module 'towers' has no attribute {name!r}")
