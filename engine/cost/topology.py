"""Topology files: the measured or published costs of a machine's devices and links.

A topology is JSON:

    {"name": "dgx1-v100",
     "sources": ["where each figure comes from"],
     "hosts": [{"name": "h0", "cores": 40, "call_seconds": 1e-4,
                "partition_seconds": 2e-5,
                "devices": [{"name": "/gpu:0", "gamma": 4e-12,
                             "op_seconds": 8e-6}, ...]}],
     "links": [{"src": "/gpu:0", "dst": ["/gpu:1", "/gpu:2"],
                "alpha": 1e-5, "beta": 4e-11, "shared": ["pcie:0"]}]}

* A device's `gamma` is the seconds per byte of adding two buffers (per
  byte of the sum), `gamma_read` (optional) the seconds per byte an op reads
  (what one more buffer costs an add), and `op_seconds` the fixed time of
  one op. An
  op that reads R bytes and writes W costs `gamma_read x R + (gamma - 2
  gamma_read) x W`; without `gamma_read`, reads and writes cost gamma / 3. CPU devices
  of one host share its `cores`; a
  GPU runs one op at a time at full speed.
* A link from `src` to `dst` (each a device or a list: every pair of them but
  a device to itself; later entries override earlier ones) takes
  `alpha + beta x bytes` seconds per transfer when it has the link alone.
  Concurrent transfers on one link divide it, as do those of links that name
  the same `shared` resource (a NIC, a PCIe switch; `host:NAME` is that
  host's cores, which a copy between its CPU devices uses).
* A host's `call_seconds` and `partition_seconds` are the fixed cost of
  calling a `tf.function`, and what each device it runs on adds.

`load` checks every field and raises TopologyError with one line naming it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping

from engine.errors import UsageError
from engine.topology.devices import canonical, split_name

__all__ = [
    "Device",
    "Host",
    "Link",
    "Topology",
    "TopologyError",
    "builtin_names",
    "builtin_path",
    "dump",
    "load",
    "loads",
]

_HERE = os.path.join(os.path.dirname(__file__), "topologies")


class TopologyError(UsageError):
    """A topology file that cannot be used; the message is one line naming the field."""


@dataclasses.dataclass(frozen=True)
class Device:
    """A device's costs.

    Attributes:
      name: its canonical name.
      gamma: seconds per byte of adding two buffers (per byte of the sum).
      op_seconds: the fixed time of one op.
      gamma_read: seconds per byte an op reads: what one more buffer costs
        an add; what an add spends past two reads is the cost of writing.
        None: reads and writes cost alike (gamma / 3 each).
    """

    name: str
    gamma: float
    op_seconds: float
    gamma_read: float | None = None

    @property
    def kind(self) -> str:
        return split_name(self.name)[0]

    def seconds(self, reads: int, writes: int) -> float:
        """Time to read `reads` bytes and write `writes` bytes."""
        read = self.gamma / 3 if self.gamma_read is None else min(self.gamma_read,
                                                                  self.gamma / 2)
        return read * reads + (self.gamma - 2 * read) * writes


@dataclasses.dataclass(frozen=True)
class Host:
    """A machine: its devices, how many of its CPU devices' ops run at once
    at full speed (`cores`), and the fixed cost of a call (`call_seconds`,
    and `partition_seconds` for each device the call runs on)."""

    name: str
    cores: float
    call_seconds: float
    partition_seconds: float
    devices: tuple[Device, ...]


@dataclasses.dataclass(frozen=True)
class Link:
    """A transfer from `src` to `dst`: `alpha + beta x bytes` seconds alone;
    transfers that name one `shared` resource (or use one link) divide it."""

    src: str
    dst: str
    alpha: float
    beta: float
    shared: tuple[str, ...] = ()

    def seconds(self, nbytes: int) -> float:
        """Time of one transfer of `nbytes` alone on the link."""
        return self.alpha + self.beta * nbytes


@dataclasses.dataclass(frozen=True)
class Topology:
    """A machine's costs (see the module's docstring).

    Attributes:
      name: what the file calls the machine.
      hosts: the hosts and their devices.
      links: one per ordered pair of devices that can send to each other.
      sources: where the figures come from (measurements or publications).
    """

    name: str
    hosts: tuple[Host, ...]
    links: Mapping[tuple[str, str], Link]
    sources: tuple[str, ...] = ()

    @property
    def devices(self) -> dict[str, Device]:
        return {d.name: d for h in self.hosts for d in h.devices}

    def host_of(self, device: str) -> Host:
        return next(h for h in self.hosts if any(d.name == device for d in h.devices))

    def link(self, src: str, dst: str) -> Link:
        try:
            return self.links[(src, dst)]
        except KeyError:
            raise TopologyError(
                f"topology {self.name!r} has no link from {src} to {dst}; add one to <links>"
            ) from None


_KEYS = {
    "topology": {"name", "comment", "sources", "hosts", "links"},
    "host": {"name", "comment", "cores", "call_seconds", "partition_seconds", "devices"},
    "device": {"name", "comment", "gamma", "op_seconds", "gamma_read"},
    "link": {"comment", "src", "dst", "alpha", "beta", "shared"},
}


def _known(entry: Mapping, what: str, where: str) -> None:
    """Refuses a field the format does not have (a typo would otherwise
    leave a default in place silently)."""
    unknown = sorted(set(entry) - _KEYS[what])
    if unknown:
        raise TopologyError(f"{where}: unknown field {unknown[0]!r}; a {what} has "
                            f"{', '.join(sorted(_KEYS[what]))}")


_KINDS = {str: "a string", list: "a list", (str, list): "a device name or a list of them"}


def _field(entry: Mapping, key: str, where: str, kind, *, minimum: float | None = 0.0,
           default=None):
    if key not in entry:
        if default is not None:
            return default
        raise TopologyError(f"{where}: missing field {key!r}")
    value = entry[key]
    if kind is float:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            raise TopologyError(f"{where}.{key}: {value!r} is not a number")
        if minimum is not None and value < minimum:
            raise TopologyError(f"{where}.{key}: {value!r} must be at least {minimum}")
        return float(value)
    if not isinstance(value, kind):
        raise TopologyError(f"{where}.{key}: {value!r} is not {_KINDS[kind]}")
    return value


def _device_name(value, where: str) -> str:
    name = canonical(value) if isinstance(value, str) else None
    if name is None:
        raise TopologyError(f"{where}: {value!r} is not a device name like /gpu:0 or "
                            "/job:worker/task:1/cpu:0")
    return name


def _names(value, where: str) -> list[str]:
    values = value if isinstance(value, list) else [value]
    return [_device_name(v, f"{where}[{i}]" if isinstance(value, list) else where)
            for i, v in enumerate(values)]


def loads(text: str, origin: str = "topology") -> Topology:
    """The topology in JSON `text`; `origin` names it in errors.

    Raises:
      TopologyError: text that is not JSON, or a missing or bad field.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TopologyError(f"{origin}: not JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise TopologyError(f"{origin}: a topology is a JSON object with hosts and links")
    _known(data, "topology", origin)
    hosts, seen = [], set()
    for h, entry in enumerate(_field(data, "hosts", origin, list)):
        where = f"{origin}: hosts[{h}]"
        if not isinstance(entry, dict):
            raise TopologyError(f"{where}: a host is an object with name, cores and devices")
        _known(entry, "host", where)
        devices = []
        for d, device in enumerate(_field(entry, "devices", where, list)):
            at = f"{where}.devices[{d}]"
            if not isinstance(device, dict):
                raise TopologyError(f"{at}: a device is an object with name, gamma and op_seconds")
            _known(device, "device", at)
            name = _device_name(_field(device, "name", at, str), f"{at}.name")
            if name in seen:
                raise TopologyError(f"{at}.name: {name} is listed twice")
            seen.add(name)
            read = (_field(device, "gamma_read", at, float) if "gamma_read" in device
                    else None)
            devices.append(Device(name, _field(device, "gamma", at, float),
                                  _field(device, "op_seconds", at, float), read))
        if not devices:
            raise TopologyError(f"{where}.devices: a host needs at least one device")
        cores = _field(entry, "cores", where, float)
        if cores < 1:
            raise TopologyError(f"{where}.cores: {cores!r} must be at least 1")
        hosts.append(Host(_field(entry, "name", where, str), cores,
                          _field(entry, "call_seconds", where, float, default=0.0),
                          _field(entry, "partition_seconds", where, float, default=0.0),
                          tuple(devices)))
    if not hosts:
        raise TopologyError(f"{origin}.hosts: a topology needs at least one host")
    host_names = {h.name for h in hosts}
    links = {}
    for k, entry in enumerate(_field(data, "links", origin, list)):
        where = f"{origin}: links[{k}]"
        if not isinstance(entry, dict):
            raise TopologyError(f"{where}: a link is an object with src, dst, alpha and beta")
        _known(entry, "link", where)
        sources = _names(_field(entry, "src", where, (str, list)), f"{where}.src")
        targets = _names(_field(entry, "dst", where, (str, list)), f"{where}.dst")
        for name in sources + targets:
            if name not in seen:
                raise TopologyError(f"{where}: {name} is no device of the hosts")
        shared = _field(entry, "shared", where, list, default=[])
        for s in shared:
            if not isinstance(s, str) or (s.startswith("host:") and s[5:] not in host_names):
                raise TopologyError(f"{where}.shared: {s!r} is not a resource name "
                                    f"(host:NAME names one of {', '.join(sorted(host_names))})")
        alpha = _field(entry, "alpha", where, float)
        beta = _field(entry, "beta", where, float)
        for src in sources:
            for dst in targets:
                if src != dst:
                    links[(src, dst)] = Link(src, dst, alpha, beta, tuple(shared))
    sources = _field(data, "sources", origin, list, default=[])
    return Topology(_field(data, "name", origin, str, default=origin), tuple(hosts), links,
                    tuple(str(s) for s in sources))


def load(path: str) -> Topology:
    """The topology in the file `path`, or the built-in of that name (builtin_names()).

    Args:
      path: a topology file (`tower-reduce-bench --fit-links`) or a built-in's name.

    Returns:
      The Topology.

    Raises:
      TopologyError: no such file or built-in, or a malformed file (one line
        naming the field).
    """
    if not os.path.exists(path) and path in builtin_names():
        path = builtin_path(path)
    try:
        with open(path) as stream:
            text = stream.read()
    except OSError as err:
        raise TopologyError(
            f"{path}: {err.strerror.lower()}; give a topology file or one of "
            f"{', '.join(builtin_names())}"
        ) from None
    return loads(text, os.path.basename(path))


def dump(topology: Topology) -> str:
    """`topology` as JSON that `loads` reads back.

    Args:
      topology: the topology to write.

    Returns:
      The text, one link per ordered pair.
    """
    data = {
        "name": topology.name,
        "sources": list(topology.sources),
        "hosts": [
            {"name": h.name, "cores": h.cores, "call_seconds": h.call_seconds,
             "partition_seconds": h.partition_seconds,
             "devices": [{k: v for k, v in dataclasses.asdict(d).items() if v is not None}
                         for d in h.devices]}
            for h in topology.hosts
        ],
        "links": [
            {"src": link.src, "dst": link.dst, "alpha": link.alpha, "beta": link.beta,
             **({"shared": list(link.shared)} if link.shared else {})}
            for link in topology.links.values()
        ],
    }
    return json.dumps(data, indent=1) + "\n"


def builtin_names() -> list[str]:
    """Names of the topology files that come with tower-train.

    Returns:
      The names `load` takes (`dgx1-v100`, ...), sorted.
    """
    return sorted(f[:-5] for f in os.listdir(_HERE) if f.endswith(".json"))


def builtin_path(name: str) -> str:
    return os.path.join(_HERE, name + ".json")
