"""Compare reducers on one workload: accuracy against epochs, bytes sent and
predicted time on machines you do not have.

    import towers

    study = towers.compare(["central", "powersgd:rank=2", "topk"], out="study",
                           devices="cpu:2", model="lenet",
                           topologies=["2x8-ethernet-100g:16"])
    print(study.table())

`compare` trains the workload once per reducer and seed (same weights, same
batches), measures each run's bytes from its placement log and its step time
here, and predicts its time on each topology with the cost model
(`towers.study.predict`); `towers.study.report` draws the table and chart.
"""

from towers.study import papers
from towers.study.predict import predict
from towers.study.runs import Run
from towers.study.scales import Scale
from towers.study.study import Method, Study, compare

__all__ = ["Method", "Run", "Scale", "Study", "compare", "papers", "predict"]
