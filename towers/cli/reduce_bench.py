"""`tower-reduce-bench`: time each reducer alone and count the bytes it moves.

For every reducer and tensor size, places one float32 tensor per tower on the
towers' devices, runs the reducer in a `tf.function`, reads the bytes it sent
from the placement of the first call, then times `--repeats` calls. Prints a
table: median time per reduction, algbw and busbw (nccl-tests' definitions),
bytes moved in total against the algorithm's ideal, and the busiest device;
with `--topology`, the cost model's prediction of each time beside it.

`--fit-links FILE` measures the devices and links instead and writes them as
a topology file (engine/cost/fit.py); `--topology FILE --predict` prints the
cost model's predictions for a machine, which need not be this one.

`--check SPEC` runs the conformance checks (engine/reducers/conformance.py) on
one reducer instead, a built-in or `package.module:function`, and prints which
pass for each tower count; the exit code is 1 when any fails.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import click
import numpy as np
from click.core import ParameterSource

from engine.core.options import VARIABLE_MODES
from engine.cost import timing
from engine.reducers.options import COMPRESSION_DTYPES
from towers.cli import cost_tables, reduce_check
from towers.cli.common import (
    OneLineCommand,
    UsageFailure,
    check_output_path,
    import_tensorflow,
)


def parse_size(text: str) -> int:
    """`64K`, `16M`, `4096` -> bytes of a float32 tensor (a multiple of 4)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit() or int(digits) < 1 or int(digits) * scale % 4:
        raise UsageFailure(f"--sizes: {text!r} is not a size in bytes of float32 like "
                           "4096, 64K or 16M")
    return int(digits) * scale


@dataclasses.dataclass
class Prepared:
    """A reducer built and traced on one workload, ready to be timed."""

    name: str
    reducer: object
    function: object
    sent: list
    shapes: list
    destinations: list
    predicted: float | None


def prepare(reducer_name, placement, shapes, options, variables, topology=None) -> Prepared:
    """`reducer_name` on float32 tensors of `shapes` per tower (one call for
    all), traced and run once; with `topology` and one tensor, the cost
    model's prediction too."""
    from engine import reducers
    from engine.reducers.conformance_checks import build_for
    from engine.reducers.measure import reduction_transfers

    reducer = reducers.build(options, placement)
    devices = placement.devices
    predicted = None
    destinations = list(devices) if variables == "replicated" else [placement.reduce_device]
    # topk, signsgd, powersgd: built for this one tensor.
    if reducers.stateful_part(reducer) is not None:
        import tensorflow as tf

        build_for(reducer, shapes, devices, destinations, tf.float32)
    function, sent = reduction_transfers(reducer, devices, destinations, shapes)
    if topology is not None and len(shapes) == 1:
        from engine.cost import compare

        size = sum(int(np.prod(shape)) for shape in shapes)
        predicted = compare.predict_seconds(reducer, topology, devices, destinations, 4 * size)
    return Prepared(reducer_name, reducer, function, sent, shapes, destinations, predicted)


def measure(prepared: Prepared, placement, options, variables, times: list[float]) -> dict:
    """One row of the table, from a prepared reducer's timed calls."""
    import tensorflow as tf

    from engine.cost.compare import bus_factor
    from engine.placement import report as placement_report
    from engine.reducers import stateful_part
    from engine.reducers.auto import auto_part

    devices, reducer, shapes = placement.devices, prepared.reducer, prepared.shapes
    size = sum(int(np.prod(shape)) for shape in shapes)
    state = stateful_part(reducer)
    per_device = {}
    for t in prepared.sent:
        per_device[t["src"]] = per_device.get(t["src"], 0) + (t["bytes"] or 0)
    # auto on one tensor is its choice: that reducer's ideal is auto's.
    auto = auto_part(reducer)
    chose = (auto.choose(size, tf.float32, devices, prepared.destinations)
             if auto is not None and len(shapes) == 1 else None)
    info = {
        "parameter_bytes": 4 * size,
        "towers": list(devices),
        "reduce_device": placement.reduce_device,
        "variables": variables,
        "reducer": chose or prepared.name,
        "compress": options.compress,
        "reduction_bytes": None if state is None else state.step_bytes(),
    }
    seconds = statistics.median(times)
    algbw = 4 * size / seconds
    return {
        "reducer": prepared.name,
        "towers": len(devices),
        "tensor_bytes": 4 * size,
        "seconds": seconds,
        "best_seconds": min(times),
        "algbw": algbw,
        "busbw": algbw * bus_factor(len(devices), variables == "replicated"),
        "predicted_seconds": prepared.predicted,
        "tensors": len(shapes),
        "chose": chose,
        "bytes_moved": sum(per_device.values()),
        "ideal_bytes": placement_report.reduction_bytes(info),
        "busiest_device_bytes": max(per_device.values(), default=0),
        "transfers_visible": bool(prepared.sent),
    }


def table(rows) -> str:
    predicted = any(r.get("predicted_seconds") is not None for r in rows)
    header = (f"{'reducer':<13}{'towers':>7}{'tensor MB':>11}{'ms':>9}"
              + (f"{'model ms':>10}{'error':>8}" if predicted else "")
              + f"{'algbw':>8}{'busbw':>8}"
              f"{'moved MB':>10}{'ideal MB':>10}{'moved/ideal':>13}{'busiest MB':>12}")
    lines = [header, "-" * len(header)]
    for r in rows:
        mb = r["tensor_bytes"] / 1e6
        if not r["transfers_visible"]:
            moved = ideal = ratio = busiest = "n/a"
        else:
            moved = f"{r['bytes_moved'] / 1e6:.2f}"
            busiest = f"{r['busiest_device_bytes'] / 1e6:.2f}"
            ideal = "?" if r["ideal_bytes"] is None else f"{r['ideal_bytes'] / 1e6:.2f}"
            ratio = ("?" if not r["ideal_bytes"] else f"{r['bytes_moved'] / r['ideal_bytes']:.3f}")
        model = ""
        if predicted:
            p = r.get("predicted_seconds")
            best = r["best_seconds"]
            model = (f"{'-':>10}{'-':>8}" if p is None else
                     f"{1e3 * p:>10.2f}{100 * (p - best) / best:>+7.0f}%")
        lines.append(
            f"{r['reducer']:<13}{r['towers']:>7}{mb:>11.2f}{1e3 * r['seconds']:>9.2f}{model}"
            f"{r['algbw'] / 1e9:>8.2f}{r['busbw'] / 1e9:>8.2f}{moved:>10}{ideal:>10}"
            f"{ratio:>13}{busiest:>12}"
        )
    lines.append("algbw, busbw: GB/s as nccl-tests define them (busbw = algbw x 2(n-1)/n "
                 "for an all-reduce)"
                 + ("; error: model against the fastest call" if predicted else ""))
    return "\n".join(lines)


# Flags of the timing run that mean nothing to --check.
BENCH_ONLY = ("sizes", "names", "variables", "repeats", "warmup", "json_path",
              "fit_links", "topology", "predict", "user_reducers", "model", "num_classes")


def model_gradients(model: str, num_classes: int | None) -> list[tuple[int, ...]]:
    """The shapes of `model`'s gradients (its trainable variables), built at
    its own input size (28x28x1 for the MNIST models) and class count."""
    import inspect

    from towers import models

    function = models.resolve(model)
    default = inspect.signature(function).parameters.get("num_classes")
    if num_classes is None:
        num_classes = (default.default if default is not None
                       and default.default is not inspect.Parameter.empty else 10)
    shape = models.default_input_shape(model) or (28, 28, 1)
    built = models.builder(model)(shape, num_classes)
    return [tuple(v.shape) for v in built.trainable_variables]


@click.command(name="tower-reduce-bench", cls=OneLineCommand)
@click.option("--devices", default=None,
              help="Towers, as for tower-train (cpu:N splits the host CPU). "
              "Default cpu:4; cpu:8 with --check; with --predict, the topology's GPUs "
              "(or all its devices), or a comma list of its device names.")
@click.option("--reduce-device", default=None,
              help="Where gradients meet; default: as tower-train's (the first GPU "
              "when every tower is a GPU, else /cpu:0).")
@click.option("--check", default=None, metavar="SPEC",
              help="Run the conformance checks on one reducer instead of timing: "
              "a built-in or package.module:function. Exit code 1 if any fails.")
@click.option("--sizes", default="1M,4M,16M", show_default=True,
              help="Bytes of each tower's float32 tensor, comma-separated "
              "(K = 1024, M = 1024^2).")
@click.option("--model", default=None,
              help="Reduce this model's gradients (its trainable variables' shapes, "
              "float32), all in one call, instead of --sizes: mlp, lenet, resnet20, "
              "resnet50 or package.module:function.")
@click.option("--num-classes", default=None, type=int,
              help="With --model: its classes; default the model's own (1000 for "
              "resnet50, 256 for transformer, else 10).")
@click.option("--reducers", "names", default="central,ring,tree,hierarchical,collective",
              show_default=True,
              help="Built-ins to time, by comma; with one parameter each where they "
              "take them (topk:ratio=0.05), and auto. powersgd sends a vector whole, "
              "as in training: time it in a run.")
@click.option("--reducer", "user_reducers", multiple=True, metavar="SPEC",
              help="A reducer of yours to time or predict too, package.module:function; "
              "repeatable.")
@click.option("--variables", default="replicated", show_default=True,
              type=click.Choice(VARIABLE_MODES),
              help="replicated: every tower needs the mean (an all-reduce); "
              "reduce-device: only the reduce device does.")
@click.option("--group-size", default=2, show_default=True, type=int,
              help="Towers per group for the hierarchical reducer.")
@click.option("--compress", default=None, type=click.Choice(COMPRESSION_DTYPES),
              help="Move gradients in this dtype (as tower-train --compress).")
@click.option("--repeats", default=20, show_default=True, type=int,
              help="Timed reductions per reducer and size; the median is reported.")
@click.option("--warmup", default=3, show_default=True, type=int,
              help="Untimed reductions first (graph building, first transfers).")
@click.option("--fit-links", default=None, metavar="FILE",
              help="Measure every device and every ordered pair's link instead of "
              "timing reducers (1 KB to 64 MB), and write them as a topology file.")
@click.option("--topology", default=None, metavar="FILE",
              help="A topology file or built-in name: predict each timed row beside "
              "it, choose for auto by it, or with --predict predict alone.")
@click.option("--predict", is_flag=True,
              help="With --topology: print the model's predictions for that machine, "
              "measuring nothing.")
@click.option("--cluster", default=None,
              help="Workers whose devices --devices names (w1/cpu:0), as for "
              "tower-train: worker=HOST:PORT,...")
@click.option("--json", "json_path", default=None, help="Also write the rows as JSON.")
def reduce_bench(devices, reduce_device, check, sizes, model, num_classes, names,
                 user_reducers, variables, group_size, compress, repeats, warmup, fit_links,
                 topology, predict, cluster, json_path):
    """Time each reducer alone and compare the bytes it moves with its ideal."""
    from engine.topology import devices as devs

    if check is not None:
        context = click.get_current_context()
        for param in context.command.params:
            if param.name in BENCH_ONLY and (
                    context.get_parameter_source(param.name) != ParameterSource.DEFAULT):
                raise UsageFailure(f"--check runs the conformance checks alone; drop "
                                   f"{param.opts[0]}")
    if predict and topology is None:
        raise UsageFailure("--predict predicts on a machine's costs; name them with "
                           "--topology FILE (or a built-in: "
                           f"{', '.join(cost_tables.builtin_topologies())})")
    if fit_links and (predict or topology):
        raise UsageFailure("--fit-links measures this machine; drop --topology and --predict")
    check_output_path("--json", json_path)
    check_output_path("--fit-links", fit_links)
    if model is not None and (predict or fit_links):
        raise UsageFailure("--model times this machine's reduction of a model's gradients; "
                           "drop --predict and --fit-links")
    if model is not None and click.get_current_context().get_parameter_source(
            "sizes") != ParameterSource.DEFAULT:
        raise UsageFailure("--model reduces the model's gradients instead of --sizes; "
                           "drop one of them")
    if num_classes is not None and (model is None or num_classes < 1):
        raise UsageFailure(f"--num-classes ({num_classes}) sizes --model's last layer; "
                           "give --model and a count of at least 1")
    byte_sizes = [parse_size(s.strip()) for s in sizes.split(",")]
    if repeats < 1:
        raise UsageFailure(f"--repeats ({repeats}) must be at least 1")
    machine = cost_tables.load_topology(topology) if topology else None
    if predict:
        import_tensorflow()
        rows = cost_tables.predict(machine, devices, reduce_device, names, user_reducers,
                                   byte_sizes, variables, group_size)
        _write_json(json_path, [dataclasses.asdict(r) for r in rows])
        return
    devices = devices or ("cpu:8" if check else "cpu:4")
    try:
        request = devs.parse_request(devices, reduce_device)
    except devs.DeviceError:
        raise  # OneLineCommand names the flags
    from engine.run import session as session_lib

    cluster_options = session_lib.cluster_options(cluster, 60.0, request)
    import_tensorflow()
    from engine import reducers

    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n.partition(":")[0] not in reducers.BUILT_INS]
    if unknown:
        raise UsageFailure(
            f"--reducers: {', '.join(unknown)} not built in; choose from "
            f"{', '.join(reducers.BUILT_INS)}"
        )
    # Every reducer may be timed, collective among them: threads for its towers.
    placement = session_lib.open_session(
        request, cluster=cluster_options, collective_towers=devs.expected_tower_count(request),
        say=lambda line: click.echo(line, err=True),
        warn=lambda line: click.echo(f"tower-reduce-bench: error: {line}", err=True),
    ).placement
    if check is not None:
        # The reduce device training would use (the same default).
        sys.exit(reduce_check.run_check(check, placement, placement.reduce_device,
                                        group_size, compress))
    if fit_links:
        fitted = cost_tables.fit_links(placement, cluster_options, fit_links)
        _write_json(json_path, {"errors": fitted.errors, "seconds": fitted.seconds})
        return
    rows = []
    # auto chooses by --topology, else by costs measured here once, up front.
    for_auto = machine
    if "auto" in chosen and for_auto is None:
        for_auto = cost_tables.quick_fit(placement, cluster_options)
    options = {}
    for name in [*chosen, *user_reducers]:
        try:
            options[name] = reducers.ReducerOptions(
                name=name, group_size=group_size, compress=compress,
                topology=for_auto if name == "auto" else None)
        except reducers.ReducerError:
            raise  # OneLineCommand names the flags
    workloads = [[(nbytes // 4,)] for nbytes in byte_sizes]
    if model is not None:
        workloads = [model_gradients(model, num_classes)]
        total = 4 * sum(int(np.prod(shape)) for shape in workloads[0])
        click.echo(f"model {model}: {len(workloads[0])} gradients, {total / 1e6:.2f} MB "
                   "per tower, reduced in one call", err=True)
    # Size by size, the reducers' calls interleaved (engine.cost.timing).
    for shapes in workloads:
        prepared = []
        for name, option in options.items():
            try:
                prepared.append(prepare(name, placement, shapes, option, variables, machine))
            except reducers.ReducerError:
                raise  # OneLineCommand names the flags
        nbytes = 4 * sum(int(np.prod(shape)) for shape in shapes)
        click.echo(f"timing {', '.join(options)} on {nbytes / 1e6:.2f} MB, "
                   f"{repeats} rounds", err=True)
        times = timing.interleaved([p.function for p in prepared], repeats, warmup)
        rows.extend(measure(p, placement, options[p.name], variables, t)
                    for p, t in zip(prepared, times))
    order = list(options)
    rows.sort(key=lambda r: order.index(r["reducer"]))
    click.echo(f"{len(placement.towers)} towers on {', '.join(placement.devices)}, "
               f"{variables} variables, median of {repeats} reductions"
               + (f" of {model}'s {len(workloads[0])} gradients" if model else "")
               + (f", model: topology {machine.name!r}" if machine else ""))
    click.echo(table(rows))
    if machine is not None:
        click.echo(cost_tables.error_line(rows))
    _write_json(json_path, rows)


def _write_json(path, data) -> None:
    if path:
        with open(path, "w") as stream:
            json.dump(data, stream, indent=1)


def main():
    reduce_bench.main(prog_name="tower-reduce-bench")
