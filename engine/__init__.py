"""tower-train's runtime, one folder per concern.

* `core`: the compiled step and its loop: towers, variable modes, losses,
  loss scaling, precision, name scopes.
* `reducers`: averaging the towers' gradients: the built-ins, user reducers,
  packing, compression, and the conformance kit.
* `data`: one DALI pipeline per tower, data-set inspection, MNIST, records.
* `placement`: the placement log: capture, report, picture.
* `run`: a run's life around the loop: building, training, checkpoints,
  signals, the non-finite guard, summaries, progress, the watchdog.
* `topology`: devices, the cluster, process-wide set-up.
* `errors`, `userfn`, `quiet`: the engine's errors, the user's own functions,
  and TensorFlow's C++ logs kept off the terminal.

The public Python API is `towers`; this package is what it is built from.
"""

__all__ = ["core", "cost", "data", "errors", "placement", "quiet", "reducers", "run", "scopes",
           "topology", "userfn"]

# The options classes declare their fields as the arguments messages name
# (engine.errors.declare): loaded with the engine, before any message is
# rendered. It imports no TensorFlow.
from engine.core import options as _options  # noqa: E402,F401
