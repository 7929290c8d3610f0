"""The placement picture: devices as boxes, transfers as labelled arrows.

Boxes are sized by op count and list the towers (and the reduction) that ran
there; arrows carry bytes per step. SVG and PNG are drawn with matplotlib
(SVG text stays text, and every box and arrow has an id naming its device or
device pair, so a picture can be checked by a program); DOT is written as text
for Graphviz users.

Layout: when all traffic goes to and from the reduce device (a central
reduction), it sits in the middle of the others; otherwise the devices stand
on a circle in the order their traffic goes round, so a ring reads as a ring.
Byte labels are moved outwards from their arrows until they cover no box.
"""

from __future__ import annotations

import collections
import math
import re
from typing import NamedTuple

from engine.placement import report

FORMATS = (".svg", ".png", ".dot")
TOWER_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]


def element_id(kind: str, *devices: str) -> str:
    """An XML-safe id: `device_cpu_1`, `edge_cpu_1__cpu_0`."""
    slug = "__".join(re.sub(r"[^A-Za-z0-9]+", "_", d).strip("_") for d in devices)
    return f"{kind}_{slug}"


def _ring_order(devices: list[str], moved: dict[tuple[str, str], int]) -> list[str]:
    """Devices in the order the traffic goes round, so that a ring's hops join
    neighbours: from the first device, each next is where most of the bytes
    from the one before went, among those not placed yet."""
    order = [devices[0]]
    left = set(devices[1:])
    while left:
        here = order[-1]
        ranked = sorted(left, key=lambda d: (-moved.get((here, d), 0), devices.index(d)))
        order.append(ranked[0])
        left.remove(ranked[0])
    return order


def _layout(devices: list[str], reduce_device: str,
            moved: dict[tuple[str, str], int] | None = None) -> dict[str, tuple[float, float]]:
    """Devices on a circle in the order their traffic goes round; when every
    transfer starts or ends on the reduce device (a star: central reduction,
    variables read there), it sits in the middle instead."""
    moved = moved or {}
    star = len(devices) > 2 and reduce_device in devices and all(
        reduce_device in pair for pair in moved
    )
    ring = [d for d in devices if d != reduce_device] if star else _ring_order(devices, moved)
    positions = {reduce_device: (0.0, 0.0)} if star else {}
    radius = 0.0 if len(devices) == 1 else (2.0 if star else 1.2 + 0.25 * len(ring))
    for i, device in enumerate(ring):
        angle = math.pi / 2 - 2 * math.pi * i / len(ring)
        positions[device] = (radius * math.cos(angle), radius * math.sin(angle))
    return positions


def _border_point(centre, half, towards) -> tuple[float, float]:
    """Where the line from a box's centre towards a point leaves the box."""
    (x, y), (w, h), (tx, ty) = centre, half, towards
    dx, dy = tx - x, ty - y
    t = min(w / abs(dx) if dx else math.inf, h / abs(dy) if dy else math.inf)
    return x + t * dx, y + t * dy


def _box_lines(entries, step, device) -> tuple[list[str], list[int]]:
    counts = collections.Counter(
        o["tower"] for o in report.ops(entries, step) if o["assigned"] == device
    )
    towers = sorted(k for k in counts if isinstance(k, int))
    def ops(n: int) -> str:
        return f"{n} op" + "s" * (n != 1)

    labels = [f"tower {k}: {ops(counts[k])}" for k in towers]
    labels += [f"{k}: {ops(counts[k])}" for k in ("input", "reduce", "other") if counts.get(k)]
    return labels, towers


def render(entries: list[dict], path: str, step: str = "train") -> None:
    """Writes the picture of `step` to `path` (.svg, .png or .dot)."""
    if path.endswith(".dot"):
        with open(path, "w") as stream:
            stream.write(dot(entries, step))
        return
    import matplotlib.pyplot as plt

    picture = draw(entries, step)
    picture.figure.savefig(path, bbox_inches="tight")
    plt.close(picture.figure)


class Picture(NamedTuple):
    """A drawn picture: the figure, and where its boxes and labels are (data
    coordinates, (x0, y0, x1, y1))."""

    figure: object
    boxes: dict[str, tuple[float, float, float, float]]
    labels: dict[tuple[str, str], tuple[float, float, float, float]]
    positions: dict[str, tuple[float, float]]


def draw(entries: list[dict], step: str = "train") -> Picture:
    """Draws the picture of `step` on a new matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    plt.rcParams["svg.fonttype"] = "none"  # text stays searchable text
    info = report.run_info(entries)
    devices = report.devices(e for e in entries if e.get("step") == step)
    ops_per_device = collections.Counter(o["assigned"] for o in report.ops(entries, step))
    most = max(ops_per_device.values(), default=1)
    moved = report.matrix(entries, step)
    positions = _layout(devices, info["reduce_device"], moved)

    fig, ax = plt.subplots(figsize=(10, 9))
    span = max((abs(c) for p in positions.values() for c in p), default=0.0) + 0.9
    ax.set_xlim(-span, span)
    ax.set_ylim(-span, span)
    ax.set_aspect("equal")
    ax.axis("off")
    halves = {}
    for device in devices:
        x, y = positions[device]
        lines, towers = _box_lines(entries, step, device)
        scale = 0.3 + 0.25 * math.sqrt(ops_per_device[device] / most)
        half = (scale + 0.15, max(0.7 * scale, 0.065 * (len(lines) + 2)))
        halves[device] = half
        colour = TOWER_COLOURS[towers[0] % len(TOWER_COLOURS)] if towers else "#dddddd"
        box = FancyBboxPatch(
            (x - half[0], y - half[1]), 2 * half[0], 2 * half[1],
            boxstyle="round,pad=0.02", facecolor=colour, alpha=0.35,
            edgecolor="black", linewidth=3 if device == info["reduce_device"] else 1,
        )
        box.set_gid(element_id("device", device))
        ax.add_patch(box)
        title = device + ("  (reduce)" if device == info["reduce_device"] else "")
        ax.text(x, y + half[1] - 0.09, title, ha="center", va="center",
                weight="bold", fontsize=10)
        ax.text(x, y - 0.06, "\n".join(lines), ha="center", va="center", fontsize=8)

    labels = []
    for (src, dst), size in sorted(moved.items()):
        start = _border_point(positions[src], halves[src], positions[dst])
        end = _border_point(positions[dst], halves[dst], positions[src])
        arrow = FancyArrowPatch(
            start, end, connectionstyle="arc3,rad=0.25", arrowstyle="-|>",
            mutation_scale=18, linewidth=1.5, color="#333333", shrinkA=0, shrinkB=0,
        )
        arrow.set_gid(element_id("edge", src, dst))
        ax.add_patch(arrow)
        (x0, y0), (x1, y1) = start, end
        # arc3 bulges to the right of src->dst; its midpoint is rad/2 out, and
        # the label is anchored on its outer side so the two directions part.
        px, py = 0.125 * (y1 - y0), -0.125 * (x1 - x0)
        label = ax.text((x0 + x1) / 2 + px, (y0 + y1) / 2 + py, f" {size:,} B/step ",
                        ha="left" if px > 0.01 else "right" if px < -0.01 else "center",
                        va="bottom" if py > 0.01 else "top" if py < -0.01 else "center",
                        fontsize=8, bbox=dict(facecolor="white", edgecolor="none", pad=1),
                        gid=element_id("label", src, dst))
        # Where it may move: (unit normal out of the bulge, chord's direction).
        chord = math.hypot(x1 - x0, y1 - y0) or 1.0
        away = (px / (0.125 * chord), py / (0.125 * chord), (x1 - x0), (y1 - y0))
        labels.append(((src, dst), label, (label.get_position(), away)))
    _clear_boxes(fig, ax, [(label, away) for _, label, away in labels], positions, halves)

    total = sum(moved.values())
    ax.set_title(
        f"{step} step: model {info['model']}, {len(info['towers'])} towers, "
        f"reduce on {info['reduce_device']}, {total:,} bytes/step moved"
    )
    return Picture(fig, box_extents(positions, halves),
                   {pair: label_extent(fig, ax, label) for pair, label, _ in labels},
                   positions)


def box_extents(positions, halves) -> dict[str, tuple[float, float, float, float]]:
    """Each device's box as (x0, y0, x1, y1) in data coordinates."""
    return {
        d: (x - halves[d][0], y - halves[d][1], x + halves[d][0], y + halves[d][1])
        for d, (x, y) in positions.items()
    }


def label_extent(fig, ax, label) -> tuple[float, float, float, float]:
    """A drawn label's box (with its padding) in data coordinates."""
    box = label.get_window_extent(fig.canvas.get_renderer()).padded(2)
    (x0, y0), (x1, y1) = ax.transData.inverted().transform([[box.x0, box.y0], [box.x1, box.y1]])
    return x0, y0, x1, y1


def _clear_boxes(fig, ax, labels, positions, halves) -> None:
    """Places each byte label at the first spot by its arrow where it covers
    no device box and no label placed before it: along the arrow from its
    middle outwards, and further out from the arrow's bulge. A label with no
    free spot keeps the one where it covers the least."""
    boxes = list(box_extents(positions, halves).values())
    placed: list[tuple[float, float, float, float]] = []
    for label, (middle, away) in labels:
        best, best_cover = None, math.inf
        for along in (0.0, -0.12, 0.12, -0.24, 0.24, -0.36, 0.36):
            for out in (0.0, 0.15, 0.3):
                x = middle[0] + along * away[2] + out * away[0]
                y = middle[1] + along * away[3] + out * away[1]
                label.set_position((x, y))
                extent = label_extent(fig, ax, label)
                cover = sum(_area(extent, b) for b in boxes + placed)
                if cover < best_cover:
                    best, best_cover = (x, y), cover
                if cover == 0:
                    break
            if best_cover == 0:
                break
        label.set_position(best)
        placed.append(label_extent(fig, ax, label))


def _area(a, b) -> float:
    """The area two (x0, y0, x1, y1) rectangles share."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def dot(entries: list[dict], step: str = "train") -> str:
    """The same picture as a Graphviz DOT graph."""
    info = report.run_info(entries)
    lines = [f'digraph "{step} step" {{', "  node [shape=box, style=rounded];"]
    for device in report.devices(e for e in entries if e.get("step") == step):
        labels, _ = _box_lines(entries, step, device)
        label = "\\n".join([device, *labels])
        width = "penwidth=3, " if device == info["reduce_device"] else ""
        lines.append(f'  "{device}" [{width}label="{label}"];')
    for (src, dst), size in sorted(report.matrix(entries, step).items()):
        lines.append(f'  "{src}" -> "{dst}" [label="{size:,} B/step"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
