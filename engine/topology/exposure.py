"""Who can reach a worker: TensorFlow's gRPC server listens on every
interface of its host (it binds 0.0.0.0), with no authentication, and runs
whatever graph a client sends it. A worker says so when it starts, with the
addresses it can be reached at, so that its user puts it where only the
chief reaches it.
"""

from __future__ import annotations

import fcntl
import socket
import struct

__all__ = ["addresses", "exposure_lines"]

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


def addresses() -> list[str] | None:
    """This host's IPv4 addresses, one per interface that has one
    (loopback first), e.g. ['127.0.0.1', '10.0.0.5']; None where they
    cannot be listed (not Linux)."""
    found = []
    if not hasattr(socket, "if_nameindex") or not hasattr(fcntl, "ioctl"):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR,
                                     struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            address = socket.inet_ntoa(packed[20:24])
            if address not in found:
                found.append(address)
    return sorted(found, key=lambda a: (not a.startswith("127."), a))


def exposure_lines(port: int, found: list[str] | None = None) -> list[str]:
    """What a worker serving on `port` says about who can reach it; `found`
    are the host's addresses (default: `addresses()`)."""
    found = addresses() if found is None else found
    if found is None:  # unknown: the warning stands
        found, outside = [], ["?"]
    else:
        outside = [a for a in found if not a.startswith("127.")]
    where = (", ".join(f"{a}:{port}" for a in found)
             or f"port {port} (this host's addresses could not be listed)")
    lines = [f"listening on every interface of this host: {where}"]
    if outside:
        lines.append(
            "anyone who can reach one of these ports can run code in this process: "
            "TensorFlow's server has no authentication; keep the port on a private "
            "network, behind a firewall rule that lets only the chief in, or reach it "
            "through an SSH tunnel (docs: Several hosts)")
    else:
        lines.append("reachable from this host only (no other interface has an address)")
    return lines
