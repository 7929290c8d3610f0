"""tower-train's Python API: explicit towers, one DALI shard each, the reduction you choose.

    import towers
    trainer = towers.Trainer("cpu:2", model="lenet", reducer="ring")
    history = trainer.fit(epochs=2)

`towers.data` holds the data sources (MNIST, directories, synthetic images,
your own DALI pipeline), `towers.models` the model zoo. The command-line tools
in `towers.cli` are thin layers over this API.
"""

from engine.errors import RunError, TowerError, UsageError
from engine.userfn import UserCodeError
from towers import data, models
from towers.data import Shard
from towers.trainer import Trainer

__all__ = [
    "RunError",
    "Shard",
    "TowerError",
    "Trainer",
    "UsageError",
    "UserCodeError",
    "data",
    "models",
]
