"""The cost model: what a reduction should take on a machine, before running it there.

* topology.py: a machine's costs (devices, links, shared resources) and its
  file format; topologies/ holds the machines users run on.
* fit.py: measuring this machine's costs into a topology.
* schedule.py: a reduction's DAG of hops and ops, read off its traced graph.
* model.py: the predicted time of a schedule on a topology.
* compare.py: reducers against each other (algbw, busbw, crossovers).
* check.py: predictions against measurements.
* timing.py: timing calls on a shared machine (interleaved rounds).

The public API is towers.cost; reducer `auto` (engine/reducers/auto.py)
chooses by it.
"""

__all__ = ["check", "compare", "fit", "model", "schedule", "timing", "topology"]
