"""Measuring a machine's costs: alpha and beta of every link, gamma of every device.

As nccl-tests do, each figure is timed over sizes from 1 KB to 64 MB (x4
apart) and fitted by least squares, each size weighted by the inverse of its
time (so that small transfers count as much as large ones):

* a link's latency `alpha`: a scalar sent back and forth between its two
  devices, each hop waiting for the last (1 hop against 17: the mean of
  both directions); its `beta`: a tensor on `src` made into one on `dst`,
  against the same work on both devices, over the sizes;
* a device's add: `x + y` of two buffers of S bytes; the slope of its time
  over S is `gamma`; what an add of READS buffers costs more, per buffer,
  is `gamma_read`; a chain of tiny ops gives `op_seconds`;
* a host's cores: every one of its devices adding at once, against one
  alone (1 when one add already fills the host, up to the device count);
* a host's fixed cost of a call: calls that hop from one of its devices to
  1, 2, ... others and back, less what the figures above say their hops and
  ops take.

Every timing is the fastest of `repeats` calls, after warm-up calls, the
calls of one figure's functions interleaved (engine.cost.timing); compare
predictions with the fastest call of what they predict.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from engine.cost import model, schedule, timing
from engine.cost.topology import Device, Host, Link, Topology
from engine.topology.devices import task_of

__all__ = ["QUICK", "Fit", "FitOptions", "fit"]

ADD_LIMIT = 16 << 20
# Buffers of the add that measures what reading one more costs.
READS = 8
# Hops there and back of the chain that measures a link's latency.
HOPS = 8


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """How much to measure.

    Attributes:
      sizes: bytes per measured buffer.
      repeats: timed calls per figure (the fastest is taken).
      warmup: untimed calls first.
    """

    sizes: tuple[int, ...] = tuple(1024 * 4 ** k for k in range(9))  # 1 KB .. 64 MB
    repeats: int = 15
    warmup: int = 3

    def __post_init__(self):
        if not self.sizes or min(self.sizes) < 4:
            raise ValueError(f"sizes {self.sizes!r}: give sizes of at least 4 bytes")
        if self.repeats < 1:
            raise ValueError(f"repeats ({self.repeats}) must be at least 1")


QUICK = FitOptions(sizes=tuple(1024 * 16 ** k for k in range(5)), repeats=7, warmup=2)
"""What reducer `auto` measures at start-up when given no topology: fewer sizes and calls, a
few seconds on a few devices."""


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted topology, and how well it explains its own measurements.

    Attributes:
      topology: the fitted costs.
      errors: per figure (`link /cpu:0->/cpu:1`, `add /cpu:0`), the median
        relative error of the fitted line against the measured times.
      seconds: how long measuring took.
    """

    topology: Topology
    errors: dict[str, float]
    seconds: float


def _line(sizes: Sequence[float], times: Sequence[float],
          large_only: bool = True) -> tuple[float, float, float]:
    """(intercept, slope, median relative error) of times ~ a + b x size.

    The slope is the least-squares slope over the larger half of the sizes,
    where it shows above the timing noise (over all of them without
    `large_only`: device counts 1..N are all as informative); the intercept
    the median of what the slope leaves over all sizes. Both are at least 0.
    """
    x, y = np.asarray(sizes, float), np.asarray(times, float)
    large = x >= np.median(x) if large_only else np.ones_like(x, bool)
    if large.sum() < 2:
        large = np.ones_like(x, bool)
    b = max(0.0, float(np.polyfit(x[large], y[large], 1)[0])) if len(set(x)) > 1 else 0.0
    a = max(0.0, float(np.median(y - b * x)))
    fitted = a + b * x
    scale = np.maximum(np.abs(y), np.max(np.abs(y)) * 1e-3 + 1e-9)
    return a, b, float(np.median(np.abs(fitted - y) / scale))


class _Sinks:
    """A scalar variable per device, for a timed function to write to: a
    function that writes where it works returns nothing, as a step does."""

    def __init__(self):
        self._sinks: dict[str, tf.Variable] = {}

    def __call__(self, device: str) -> tf.Variable:
        if device not in self._sinks:
            with tf.device(device):
                self._sinks[device] = tf.Variable(0.0, trainable=False)
        return self._sinks[device]


def _variable(device: str, nbytes: int) -> tf.Variable:
    with tf.device(device):
        return tf.Variable(tf.ones([max(1, nbytes // 4)], tf.float32), trainable=False)


def _gather_function(devices: Sequence[str], sinks: _Sinks):
    """A scalar from the first device to each other and back, summed where
    it started: a call that runs on `devices` and hops between them, as a
    reduction's does."""
    sink = sinks(devices[0])

    @tf.function(autograph=False)
    def gather():
        with tf.device(devices[0]):
            x = sink.read_value()
        away = []
        for device in devices[1:]:
            with tf.device(device):
                away.append(tf.identity(x) + 1.0)
        with tf.device(devices[0]):
            sink.assign(tf.add_n([x + 1.0, *[tf.identity(y) for y in away]]))
    return gather


def _chain_function(device: str, length: int, sinks: _Sinks):
    """`length` tiny ops one after the other on `device`."""
    sink = sinks(device)

    @tf.function(autograph=False)
    def chain():
        with tf.device(device):
            x = sink.read_value()
            for _ in range(length):
                x = tf.math.sin(x)
            sink.assign(x)
    return chain


def _adds_function(devices: Sequence[str], nbytes: int, sinks: _Sinks, count: int = 2):
    """An add of `count` buffers of `nbytes`, one op, on each of `devices`
    at once."""
    adds = [(d, [_variable(d, nbytes) for _ in range(count)], sinks(d)) for d in devices]

    @tf.function(autograph=False)
    def add():
        for device, xs, sink in adds:
            with tf.device(device):
                sink.assign(tf.add_n([x.read_value() for x in xs])[0])
    return add


def _transfer_function(src: str, dst: str, source: tf.Variable, sinks: _Sinks,
                       move: bool = True):
    """The first `n` elements of `source` (on `src`) made a tensor on `dst`;
    with `move=False`, the same work on both devices, and no transfer."""
    src_sink, dst_sink = sinks(src), sinks(dst)

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
    def transfer(n):
        with tf.device(src):
            part = source.read_value()[:n]
        if move:
            with tf.device(dst):
                dst_sink.assign(tf.identity(part)[0])
        else:
            with tf.device(src):
                src_sink.assign(part[0])
            with tf.device(dst):
                dst_sink.assign(dst_sink.read_value())
    return transfer


def _pooled(measured: dict[str, Device], links: dict, by_host: dict[str, list[str]]):
    """The CPU devices of one host are one processor and one memory: each
    gets the median of their gammas and op times, and each link between two
    of them the median of those links' alphas and betas. Per pair, the
    timing noise of a shared machine is larger than any real difference."""
    devices, pooled_links = dict(measured), dict(links)
    for members in by_host.values():
        cpus = [d for d in members if measured[d].kind == "cpu"]
        if len(cpus) < 2:
            continue
        gamma = statistics.median(measured[d].gamma for d in cpus)
        op_seconds = statistics.median(measured[d].op_seconds for d in cpus)
        read = statistics.median(measured[d].gamma_read for d in cpus)
        for d in cpus:
            devices[d] = Device(d, gamma, op_seconds, read)
        inside = [links[(a, b)] for a in cpus for b in cpus if a != b]
        alpha = statistics.median(link.alpha for link in inside)
        beta = statistics.median(link.beta for link in inside)
        for link in inside:
            pooled_links[(link.src, link.dst)] = dataclasses.replace(link, alpha=alpha, beta=beta)
    return devices, pooled_links


def _hops_function(first: str, second: str, hops: int, sinks: _Sinks):
    """A scalar sent `hops` times back and forth between two devices, each
    hop waiting for the one before: the latency of a hop, alone."""
    sink = sinks(first)
    ends = (first, second)

    @tf.function(autograph=False)
    def hop():
        with tf.device(first):
            x = sink.read_value()
        for k in range(hops):
            with tf.device(ends[(k + 1) % 2]):
                x = tf.identity(x) + 1.0
        with tf.device(ends[hops % 2]):
            sinks(ends[hops % 2]).assign(x)
    return hop


def _host_of(device: str) -> str:
    """Devices of this process are on `localhost`; a worker's, on its task."""
    return task_of(device) or "localhost"


def fit(devices: Sequence[str], options: FitOptions = FitOptions(), *,
        hosts: dict[str, str] | None = None, name: str = "measured",
        progress: Callable[[str], None] | None = None) -> Fit:
    """Measures `devices` and the links between them.

    Args:
      devices: canonical names of the devices to measure (they must exist).
      options: sizes and repeats.
      hosts: the machine each device is on, when it is not its task's
        (workers on this machine share its cores); default: one host per task.
      name: the topology's name.
      progress: called with a line after each figure.

    Returns:
      A Fit.
    """
    # Every figure traces functions of its own (one per size, by design):
    # TensorFlow's retracing warning would only alarm the user.
    logger = tf.get_logger()
    logger.addFilter(_no_retracing)
    try:
        return _fit(devices, options, hosts, name, progress)
    finally:
        logger.removeFilter(_no_retracing)


def _no_retracing(record: logging.LogRecord) -> bool:
    return "triggered tf.function retracing" not in record.getMessage()


def _fit(devices, options, hosts, name, progress) -> Fit:
    say = progress or (lambda line: None)
    started = time.perf_counter()
    repeats, warmup = options.repeats, options.warmup
    sizes = sorted(options.sizes)
    # Adds stop at 16 MB: past it, every call's fresh output buffer costs the
    # kernel's page faults more than the add (a 64 MB add: 30% more per byte).
    add_sizes = [s for s in sizes if s <= ADD_LIMIT] or sizes[:1]
    machine = {d: (hosts or {}).get(d) or _host_of(d) for d in devices}
    by_host: dict[str, list[str]] = {}
    for device in devices:
        by_host.setdefault(machine[device], []).append(device)
    errors: dict[str, float] = {}
    sinks = _Sinks()

    def timed(*calls, repeats=repeats):
        return timing.fastest([lambda f=f, a=a: f(*a) for f, a in calls], repeats, warmup)

    # Each device: the fixed time of an op, and seconds per byte of an add.
    measured: dict[str, Device] = {}
    for device in devices:
        short, long = timed((_chain_function(device, 1, sinks), ()),
                            (_chain_function(device, 33, sinks), ()), repeats=10 * repeats)
        op_seconds = max(0.0, (long - short) / 32)
        times = timed(*[(_adds_function([device], s, sinks), ()) for s in add_sizes])
        _, gamma, errors[f"add {device}"] = _line(add_sizes, times)
        # What each buffer more costs an add: the read of one more byte.
        times = timed(*[(_adds_function([device], s, sinks, READS), ()) for s in add_sizes])
        _, slope, errors[f"add_n {device}"] = _line(add_sizes, times)
        gamma_read = max(0.0, (slope - gamma) / (READS - 2))
        measured[device] = Device(device, gamma, op_seconds, gamma_read)
        say(f"device {device}: add {1e9 * gamma:.3f} ns per byte, read "
            f"{1e9 * gamma_read:.3f} ns per byte, {1e6 * op_seconds:.1f} us per op")

    # Each host: how many adds of the largest size run at once at full speed.
    cores = {}
    for host, members in by_host.items():
        if len(members) == 1:
            cores[host] = 1.0
            continue
        together, alone = timed((_adds_function(members, add_sizes[-1], sinks), ()),
                                (_adds_function(members[:1], add_sizes[-1], sinks), ()))
        limit = len(members) if host != "localhost" else min(len(members), os.cpu_count() or 1)
        cores[host] = float(min(limit, max(1.0, len(members) * alone / together)))
        say(f"host {host}: {len(members)} adds at once run as fast as on "
            f"{cores[host]:.2f} cores")

    # Each pair: the latency of a hop, from a chain of hops back and forth
    # (both directions' mean); each ordered pair: the cost per byte, from a
    # transfer against the same work on both devices.
    latency = {}
    for i, first in enumerate(devices):
        for second in devices[i + 1:]:
            one, many = timed((_hops_function(first, second, 1, sinks), ()),
                              (_hops_function(first, second, 1 + 2 * HOPS, sinks), ()),
                              repeats=4 * repeats)
            latency[(first, second)] = latency[(second, first)] = max(
                0.0, (many - one) / (2 * HOPS))
    links = {}
    counts = [tf.constant(max(1, s // 4), tf.int32) for s in sizes]
    for src in devices:
        source = _variable(src, sizes[-1])
        for dst in devices:
            if dst == src:
                continue
            stay = _transfer_function(src, dst, source, sinks, move=False)
            move = _transfer_function(src, dst, source, sinks)
            times = timed(*[(f, (n,)) for n in counts for f in (stay, move)])
            stayed, moved = times[::2], times[1::2]
            _, beta, _ = _line(sizes, [m - s for s, m in zip(stayed, moved)])
            alpha = latency[(src, dst)]
            # How well the line explains the calls: stay + alpha + beta x size.
            errors[f"link {src}->{dst}"] = statistics.median(
                abs(s + alpha + beta * size - m) / m for s, m, size in zip(stayed, moved, sizes))
            shared = (f"host:{machine[src]}",) if machine[src] == machine[dst] else ()
            links[(src, dst)] = Link(src, dst, alpha, beta, shared)
            say(f"link {src} -> {dst}: {1e6 * alpha:.1f} us + {1e9 * beta:.4f} ns per byte")
    measured, links = _pooled(measured, links, by_host)

    # The fixed cost of a call, and of each device it runs on: calls that
    # hop from one device to 1, 2, ... others and back, less what the model
    # with the figures above says their hops and ops take.
    partial = Topology("partial", tuple(
        Host(h, cores[h], 0.0, 0.0, tuple(measured[d] for d in m))
        for h, m in by_host.items()), links)
    fixed = {}
    for host, members in by_host.items():
        functions = [_gather_function(members[:k], sinks) for k in range(1, len(members) + 1)]
        times = timed(*[(f, ()) for f in functions])
        spent = [t - model.predict(schedule.from_graph(f.get_concrete_function().graph),
                                   partial).seconds for t, f in zip(times, functions)]
        call, per_device, errors[f"call {host}"] = _line(range(1, len(members) + 1), spent,
                                                         large_only=False)
        fixed[host] = (call, per_device)
        say(f"call on {host}: {1e6 * call:.0f} us + {1e6 * per_device:.0f} us per device")
    topology = Topology(
        name=name,
        hosts=tuple(
            Host(host, cores[host], *fixed[host], tuple(measured[d] for d in members))
            for host, members in by_host.items()
        ),
        links=links,
        sources=((f"measured by tower-reduce-bench's link fit on {os.uname().nodename}, "
                 f"{len(sizes)} sizes from {sizes[0]} to {sizes[-1]} bytes, fastest of "
                 f"{repeats} calls"),),
    )
    del sinks, timed
    gc.collect()  # the measured buffers, held by the functions' reference cycles
    return Fit(topology, errors, time.perf_counter() - started)
