"""The machines a study predicts for: a topology and how many of its devices."""

from __future__ import annotations

import dataclasses

from engine.errors import UsageError

__all__ = ["Scale"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scale:
    """A topology (a built-in's name or a file) at a number of towers.

    Attributes:
      topology: `towers.cost.builtin_topologies()` names one; else a path.
      towers: how many of its devices train (its GPUs first,
        `towers.cost.towers_of`).
      compute_ms: a step's compute on one of its devices, in ms; None takes
        each run's step time measured here.
    """

    topology: str
    towers: int
    compute_ms: float | None = None

    def __post_init__(self):
        from engine.cost.topology import TopologyError, load

        try:
            machine = load(self.topology)
        except TopologyError as err:
            raise UsageError(f"<topologies> {self.label!r}: {err}") from None
        devices = [d for d in machine.devices if machine.devices[d].kind == "gpu"]
        devices = devices or list(machine.devices)
        if not 2 <= self.towers <= len(devices):
            raise UsageError(
                f"<topologies> {self.label!r}: {machine.name} has {len(devices)} devices for "
                f"towers; give 2 to {len(devices)}"
            )
        if self.compute_ms is not None and not self.compute_ms > 0:
            raise UsageError(f"<topologies> {self.label!r}: the compute time must be positive")

    @property
    def label(self) -> str:
        """`name:towers` (and `:compute_ms` when given), as tables and charts name it."""
        name = self.topology.rsplit("/", 1)[-1].removesuffix(".json")
        compute = "" if self.compute_ms is None else f":{self.compute_ms:g}"
        return f"{name}:{self.towers}{compute}"

    @classmethod
    def parse(cls, spec: str | Scale) -> Scale:
        """`NAME:TOWERS` or `NAME:TOWERS:COMPUTE_MS` (`2x8-ethernet-100g:16`).

        Args:
          spec: the text, or a Scale (returned as it is).

        Raises:
          UsageError: a spec of another shape, naming it.
        """
        if isinstance(spec, Scale):
            return spec
        name, _, rest = spec.partition(":")
        towers, _, compute = rest.partition(":")
        try:
            count, milliseconds = int(towers), float(compute) if compute else None
        except ValueError:
            raise UsageError(
                f"<topologies> {spec!r} is not NAME:TOWERS[:COMPUTE_MS], e.g. "
                "2x8-ethernet-100g:16"
            ) from None
        return cls(topology=name, towers=count, compute_ms=milliseconds)
