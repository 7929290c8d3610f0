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

from importlib import metadata as _metadata

from engine import quiet

# TensorFlow's C++ start-up logs stay off the terminal, whoever imports it
# next (the user's `import keras` too); TF_CPP_MIN_LOG_LEVEL set by the user
# wins (engine.quiet).
quiet.quiet_tensorflow()

from engine.errors import RunError, TowerError, UsageError  # noqa: E402
from engine.userfn import UserCodeError  # noqa: E402
from towers import (  # noqa: E402
    callbacks,
    data,
    models,
    placement,
    study,  # noqa: E402
)
from towers.data import Shard  # noqa: E402
from towers.study import compare  # noqa: E402
from towers.trainer import Trainer  # noqa: E402

try:
    __version__ = _metadata.version("tower-train")
except _metadata.PackageNotFoundError:  # run from a checkout that is not installed
    __version__ = "0+unknown"

__all__ = [
    "RunError",
    "Shard",
    "TowerError",
    "Trainer",
    "UsageError",
    "UserCodeError",
    "__version__",
    "callbacks",
    "compare",
    "cost",
    "data",
    "models",
    "placement",
    "reducers",
    "study",
]


def __getattr__(name):
    # towers.reducers and towers.cost import TensorFlow, which the CLI
    # configures (its log level, its devices) before importing it: load them
    # on first use.
    if name in ("reducers", "cost"):
        import importlib

        return importlib.import_module(f"towers.{name}")
    raise AttributeError(f"module 'towers' has no attribute {name!r}")
