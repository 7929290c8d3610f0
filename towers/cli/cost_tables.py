"""What tower-reduce-bench prints for the cost model: fitted links, predictions, errors.

The work is towers.cost's; this module turns flags into its arguments and its
results into tables.
"""

from __future__ import annotations

import statistics

import click

from towers.cli.common import UsageFailure


def builtin_topologies() -> list[str]:
    from engine.cost import topology

    return topology.builtin_names()


def load_topology(path: str):
    """The topology of `--topology`, read before TensorFlow starts."""
    from engine.cost import topology

    try:
        return topology.load(path)
    except topology.TopologyError as err:
        raise UsageFailure(f"--topology {err}") from None


def machines(placement, cluster_options) -> dict[str, str]:
    """The machine of each device: a worker at a loopback address runs on
    this machine and shares its cores (`localhost`); others are their task."""
    from engine.topology import cluster, devices

    addresses = dict(cluster_options.remote_tasks()) if cluster_options else {}
    out = {}
    for device in [*placement.devices, placement.reduce_device]:
        task = devices.task_of(device)
        address = addresses.get(task)
        local = task is None or (address is not None and cluster.is_loopback(address))
        out[device] = "localhost" if local else task
    return out


def fit_links(placement, cluster_options, path: str):
    """Measures the placement's devices and links, writes the topology to
    `path`, prints the fitted figures; returns the Fit."""
    from engine.cost import fit, topology

    devices = list(dict.fromkeys([*placement.devices, placement.reduce_device]))
    click.echo(f"measuring {len(devices)} devices and {len(devices) * (len(devices) - 1)} "
               "links, 1 KB to 64 MB", err=True)
    fitted = fit.fit(devices, hosts=machines(placement, cluster_options), name=path,
                     progress=lambda line: click.echo(line, err=True))
    with open(path, "w") as stream:
        stream.write(topology.dump(fitted.topology))
    click.echo(fit_table(fitted))
    click.echo(f"wrote {path} ({fitted.seconds:.1f} s of measuring)")
    return fitted


def quick_fit(placement, cluster_options):
    """The costs `auto` chooses by when no --topology is given: measured
    here, with fewer sizes and calls (engine.cost.fit.QUICK)."""
    from engine.cost import fit

    devices = list(dict.fromkeys([*placement.devices, placement.reduce_device]))
    fitted = fit.fit(devices, fit.QUICK, hosts=machines(placement, cluster_options),
                     name="fitted at start-up")
    click.echo(f"auto: measured {len(devices)} devices in {fitted.seconds:.1f} s", err=True)
    return fitted.topology


def fit_table(fitted) -> str:
    """Hosts, devices and links with their figures and how well each line
    fits its own measurements."""
    t = fitted.topology
    lines = []
    for host in t.hosts:
        lines.append(f"host {host.name}: {host.cores:.2f} cores at once; a call "
                     f"{1e6 * host.call_seconds:.0f} us + {1e6 * host.partition_seconds:.0f} us "
                     f"per device (fit error {_pct(fitted.errors.get(f'call {host.name}'))})")
    lines.append(f"{'device':<28}{'add ns/B':>10}{'read ns/B':>11}{'op us':>8}"
                 f"{'fit error':>11}")
    for host in t.hosts:
        for d in host.devices:
            errors = [fitted.errors.get(f"{what} {d.name}") for what in ("add", "add_n")]
            worst = max((e for e in errors if e is not None), default=None)
            read = "-" if d.gamma_read is None else f"{1e9 * d.gamma_read:.4f}"
            lines.append(f"{d.name:<28}{1e9 * d.gamma:>10.4f}{read:>11}"
                         f"{1e6 * d.op_seconds:>8.2f}{_pct(worst):>11}")
    lines.append(f"{'link':<44}{'alpha us':>10}{'beta ns/B':>11}{'GB/s':>8}{'fit error':>11}")
    for (src, dst), link in t.links.items():
        rate = f"{1e-9 / link.beta:.1f}" if link.beta else "inf"
        lines.append(f"{src + ' -> ' + dst:<44}{1e6 * link.alpha:>10.1f}{1e9 * link.beta:>11.4f}"
                     f"{rate:>8}{_pct(fitted.errors.get(f'link {src}->{dst}')):>11}")
    errors = list(fitted.errors.values())
    lines.append(f"the fitted lines explain their own measurements to a median error of "
                 f"{_pct(statistics.median(errors))} (worst {_pct(max(errors))}); the CPU "
                 "devices of one host share one figure, their pairs' median")
    return "\n".join(lines)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def predict(machine, devices, reduce_device, names, user_reducers, sizes, variables,
            group_size):
    """Prints the model's table for `machine`; returns its rows."""
    from engine.cost import compare
    from engine.cost.topology import TopologyError
    from engine.reducers.base import ReducerError
    from engine.topology.devices import canonical
    from towers import cost

    chosen = [n.strip() for n in names.split(",") if n.strip()]
    # The timing default lists collective, which the model cannot see: skip
    # it there, refuse it when named.
    if names == "central,ring,tree,hierarchical,collective":
        chosen = list(cost.MODELLED)
    towers = None
    if devices:
        # `0,3,2,1`: the topology's GPUs by ordinal, as tower-train takes them.
        towers = [f"/gpu:{d.strip()}" if d.strip().isdigit() else canonical(d.strip()) or d.strip()
                  for d in devices.split(",")]
    towers = towers or compare.towers_of(machine)
    reduce_device = (canonical(reduce_device) if reduce_device
                     else compare.default_reduce_device(machine, towers))
    destinations = towers if variables == "replicated" else [reduce_device]
    try:
        built = cost.reducers_for([*chosen, *user_reducers], towers, reduce_device, group_size)
    except ReducerError as err:  # the flag's option is named `names`
        raise UsageFailure(err.render({"reducers": "--reducers"})) from None
    try:
        rows = compare.predict_rows(built, machine, towers, destinations, sizes)
    except TopologyError as err:
        raise UsageFailure(f"--devices: {err}") from None
    click.echo(f"predicted on topology {machine.name!r}: {len(towers)} towers "
               f"({', '.join(towers)}), reduce device {reduce_device}, {variables} variables")
    header = f"{'reducer':<16}{'tensor':>10}{'model ms':>10}{'algbw':>8}{'busbw':>8}"
    click.echo(header)
    click.echo("-" * len(header))
    for r in rows:
        click.echo(f"{r.reducer:<16}{size_text(r.tensor_bytes):>10}{1e3 * r.seconds:>10.3f}"
                   f"{r.algbw / 1e9:>8.2f}{r.busbw / 1e9:>8.2f}")
    click.echo("algbw, busbw: GB/s as nccl-tests define them")
    best = compare.fastest(rows)
    click.echo("fastest: " + ", ".join(f"{size_text(s)} {name}" for s, name in best.items()))
    if "central" in built:
        for other in ("ring", "tree", "hierarchical"):
            if other not in built:
                continue
            size = compare.crossover(built["central"], built[other], machine, towers,
                                     destinations, min(sizes), max(sizes))
            if size is not None:
                click.echo(f"crossover: {other} is faster than central from "
                           f"{size_text(size)} per tower")
    return rows


def size_text(nbytes: int) -> str:
    from engine.reducers.auto import size_text as text

    return text(nbytes)


def error_line(rows) -> str:
    """Median and worst error of the predictions, and whether they order the
    reducers as measured."""
    from engine.cost.check import order_agreement, relative_errors

    errors = relative_errors(rows)
    if not errors:
        return "model: no row predicted"
    agree, compared, ties = order_agreement(rows)
    tied = f" (and ties {ties} more)" if ties else ""
    return (f"model: median absolute error {100 * statistics.median(map(abs, errors)):.0f}% "
            f"over {len(errors)} rows (worst {100 * max(map(abs, errors)):.0f}%); "
            f"it orders {agree} of {compared} pairs of reducers measured more than 20% apart "
            f"as measured{tied}")
