"""Budgets for a captured step: bytes between devices, strays, peak memory.

A budget is checked against a placement log, so a CI job can pin a model's
traffic: a budget of at most 500,000 bytes from /cpu:1 to /cpu:0 fails when
the step moves more, naming the largest tensor over it.
"""

from __future__ import annotations

import dataclasses
import re

from engine.errors import UsageError
from engine.placement import report
from engine.topology.devices import canonical

ANY = "*"  # a budget's device that matches every device


@dataclasses.dataclass(frozen=True)
class Budget:
    """Limits on one step (per call of the step).

    Attributes:
      max_bytes: (source, destination, bytes): at most `bytes` from a device
        matching `source` to one matching `destination`, per ordered pair of
        devices; `*` matches any device.
      max_total_bytes: at most this many bytes between all devices together.
      no_strays: no op of a tower outside its tower's device.
      max_peak_memory: (device, bytes): the peak memory of each device
        matching `device` (`*` for any) at most `bytes`; needs the log's
        timings.
    """

    max_bytes: tuple[tuple[str, str, int], ...] = ()
    max_total_bytes: int | None = None
    no_strays: bool = False
    max_peak_memory: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        for src, dst, limit in self.max_bytes:
            _check_limit("max_bytes", limit)
            _check_device("max_bytes", src)
            _check_device("max_bytes", dst)
        if self.max_total_bytes is not None:
            _check_limit("max_total_bytes", self.max_total_bytes)
        for device, limit in self.max_peak_memory:
            _check_limit("max_peak_memory", limit)
            _check_device("max_peak_memory", device)

    @property
    def empty(self) -> bool:
        """True when the budget sets no limit at all."""
        return self == Budget()


def _check_limit(name: str, limit) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise UsageError(f"<{name}>: {limit!r} is not a byte count; give an integer >= 0")


def _check_device(name: str, device: str) -> None:
    """A budget names devices as the log does: `/cpu:1`, `/gpu:0`,
    `/job:worker/task:1/cpu:0`, or `*`."""
    if device != ANY and canonical(device) != device:
        short = canonical(device) or canonical("/" + device)
        fix = f"write {short}" if short else "write it as the log does, e.g. /cpu:1 or /gpu:0"
        raise UsageError(f"<{name}>: {device!r} is not a device as the log names them; {fix}, or *")


_PAIR = re.compile(r"^\s*(\S+?)\s*->\s*(\S+?)\s*=\s*(\d+)\s*$")
_DEVICE = re.compile(r"^\s*(\S+?)\s*=\s*(\d+)\s*$")


def _parse(pattern: re.Pattern, text: str, name: str, form: str, examples: str) -> tuple:
    match = pattern.match(text)
    if not match:
        raise UsageError(f"<{name}>: {text!r} is not {form}; for example {examples}")
    *devices, limit = match.groups()
    return (*devices, int(limit))


def parse_pair(text: str, name: str = "max_bytes") -> tuple[str, str, int]:
    """`SRC->DST=N` as (SRC, DST, N).

    Raises:
      UsageError: naming `name` and the text when it is not of that form.
    """
    return _parse(_PAIR, text, name, "SRC->DST=BYTES",
                  "'/cpu:1->/cpu:0=500000' or '*->/cpu:0=1000000'")


def parse_device(text: str, name: str = "max_peak_memory") -> tuple[str, int]:
    """`DEVICE=N` as (DEVICE, N).

    Raises:
      UsageError: naming `name` and the text when it is not of that form.
    """
    return _parse(_DEVICE, text, name, "DEVICE=BYTES", "'/cpu:1=50000000' or '*=1000000000'")


def held(entries: list[dict]) -> list[str]:
    """The steps a log holds, of train and eval."""
    return [s for s in report.STEPS if report.ops(entries, s)]


def unknown(entries: list[dict], step: str = "train") -> int:
    """How many transfers of `step` have no known size (budgets skip them)."""
    return sum(1 for t in report.transfers(entries, step) if t["bytes"] is None)


def _matches(pattern: str, device: str) -> bool:
    return pattern == ANY or pattern == device


def _largest(transfers: list[dict]) -> str:
    biggest = max(transfers, key=lambda t: t["bytes"] or 0)
    shape = "x".join(map(str, biggest["shape"] or [])) or "scalar"
    return (f"largest tensor {biggest['tensor']} ({biggest['dtype']}[{shape}], "
            f"{biggest['bytes']:,} bytes)")


def violations(entries: list[dict], budget: Budget, step: str = "train") -> list[str]:
    """One line per limit of `budget` that `step` of the log goes over.

    Transfers of unknown size (`bytes` null) are not counted; `unknown` says
    how many a step has.

    Returns:
      The lines, empty when the step keeps to the budget.

    Raises:
      UsageError: the log has no `step`; a device of the budget is not one
        of the step's; `max_peak_memory` is set and the log has no memory
        records.
    """
    out = []
    if not report.ops(entries, step):
        raise UsageError(f"the log has no {step} step; it holds: "
                         f"{', '.join(held(entries)) or 'neither train nor eval'}")
    moved = report.transfers(entries, step)
    data = [t for t in moved if t["bytes"]]
    known = set(report.devices(e for e in entries if e.get("step") == step))
    for name, patterns in (("max_bytes", [d for s, t, _ in budget.max_bytes for d in (s, t)]),
                           ("max_peak_memory", [d for d, _ in budget.max_peak_memory])):
        for pattern in patterns:
            if pattern != ANY and pattern not in known:
                raise UsageError(f"<{name}>: {pattern} is not a device of the {step} step; "
                                 f"it has {', '.join(sorted(known))}")
    for src, dst, limit in budget.max_bytes:
        pairs = sorted({(t["src"], t["dst"]) for t in data
                        if _matches(src, t["src"]) and _matches(dst, t["dst"])})
        for a, b in pairs:
            these = [t for t in data if (t["src"], t["dst"]) == (a, b)]
            total = sum(t["bytes"] for t in these)
            if total > limit:
                out.append(f"{a} -> {b}: {total:,} bytes per {step} step, over the budget "
                           f"{src}->{dst}={limit:,}; {_largest(these)}")
    if budget.max_total_bytes is not None:
        total = sum(t["bytes"] for t in data)
        if total > budget.max_total_bytes:
            out.append(f"all devices: {total:,} bytes per {step} step, over the budget of "
                       f"{budget.max_total_bytes:,}; {_largest(data)}")
    if budget.no_strays:
        out += [f"stray op {o['name']} ({o['op']}): {o['stray']}"
                for o in report.strays(report.ops(entries, step))]
    if budget.max_peak_memory:
        peaks = report.memory(entries, step)
        if not peaks:
            raise UsageError(
                "<max_peak_memory>: the log has no memory records (they come with the "
                "second call of the step); write it with a run of at least 2 steps"
            )
        for pattern, limit in budget.max_peak_memory:
            for device, record in sorted(peaks.items()):
                if _matches(pattern, device) and record["peak_bytes"] > limit:
                    out.append(f"{device}: peak memory {record['peak_bytes']:,} bytes in the "
                               f"{step} step, over the budget {pattern}={limit:,}")
    return out
