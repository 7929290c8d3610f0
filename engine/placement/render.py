"""The placement picture: devices as boxes, transfers as labelled arrows.

Boxes are sized by op count and list the towers (and the reduction) that ran
there; arrows carry bytes per step. SVG and PNG are drawn with matplotlib
(SVG text stays text, and every box and arrow has an id naming its device or
device pair, so a picture can be checked by a program); DOT is written as text
for Graphviz users.
"""

from __future__ import annotations

import collections
import math
import re

from engine.placement import report

FORMATS = (".svg", ".png", ".dot")
TOWER_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"]


def element_id(kind: str, *devices: str) -> str:
    """An XML-safe id: `device_cpu_1`, `edge_cpu_1__cpu_0`."""
    slug = "__".join(re.sub(r"[^A-Za-z0-9]+", "_", d).strip("_") for d in devices)
    return f"{kind}_{slug}"


def _layout(devices: list[str], reduce_device: str) -> dict[str, tuple[float, float]]:
    """Devices on a circle; with three or more, the reduce device sits in the middle."""
    ring = [d for d in devices if d != reduce_device] if len(devices) > 2 else devices
    positions = {} if ring is devices else {reduce_device: (0.0, 0.0)}
    radius = 0.0 if len(devices) == 1 else (2.0 if positions else 1.4)
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    plt.rcParams["svg.fonttype"] = "none"  # text stays searchable text
    info = report.run_info(entries)
    devices = report.devices(e for e in entries if e.get("step") == step)
    ops_per_device = collections.Counter(o["assigned"] for o in report.ops(entries, step))
    most = max(ops_per_device.values(), default=1)
    positions = _layout(devices, info["reduce_device"])

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

    for (src, dst), size in sorted(report.matrix(entries, step).items()):
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
        ax.text((x0 + x1) / 2 + px, (y0 + y1) / 2 + py, f" {size:,} B/step ",
                ha="left" if px > 0.01 else "right" if px < -0.01 else "center",
                va="bottom" if py > 0.01 else "top" if py < -0.01 else "center",
                fontsize=8, bbox=dict(facecolor="white", edgecolor="none", pad=1),
                gid=element_id("label", src, dst))

    total = sum(report.matrix(entries, step).values())
    ax.set_title(
        f"{step} step: model {info['model']}, {len(info['towers'])} towers, "
        f"reduce on {info['reduce_device']}, {total:,} bytes/step moved"
    )
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


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
