"""What a study shows: a summary per reducer, the table, the chart and the JSON."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics

from towers.callbacks import Callback

__all__ = ["EpochLine", "default_target", "front", "pareto", "rows", "table", "write"]


class EpochLine(Callback):
    """Says each epoch's loss and held-out accuracy while a run trains."""

    def __init__(self, say, epochs: int):
        self.say, self.epochs = say, epochs

    def on_epoch_end(self, epoch, logs):
        loss = "-" if logs.get("loss") is None else f"{logs['loss']:.4f}"
        accuracy = logs.get("eval_accuracy")
        held_out = "" if accuracy is None else f", eval_accuracy {accuracy:.4f}"
        self.say(f"  epoch {epoch + 1}/{self.epochs}: loss {loss}{held_out}")


def _by_reducer(study) -> dict[str, list]:
    return {r: [run for run in study.runs if run.reducer == r] for r in study.reducers}


def _curve(runs) -> list[float]:
    """Held-out accuracy per epoch, the mean over the seeds."""
    return [statistics.fmean(run.epochs[e].get("eval_accuracy") or 0.0 for run in runs)
            for e in range(min(len(run.epochs) for run in runs))]


def default_target(study) -> float:
    """99% of the baseline's final held-out accuracy, mean over its seeds."""
    baseline = _by_reducer(study)[study.reducers[0]]
    return round(0.99 * _curve(baseline)[-1], 4)


def rows(study) -> list[dict]:
    """One summary per reducer: accuracy over the seeds (final mean and
    spread, best), bytes per step and their ratio to the baseline's, state
    bytes, the step time here, and per scale the predicted step, epoch and
    time to `study.target_accuracy` (None where the mean curve never gets
    there)."""
    out = []
    groups = _by_reducer(study)
    base = statistics.fmean(run.mean_bytes_per_step for run in groups[study.reducers[0]])
    for reducer, runs in groups.items():
        finals = [run.epochs[-1].get("eval_accuracy") or 0.0 for run in runs]
        # Perplexity: exp of the held-out cross-entropy (per byte for text).
        perplexities = [math.exp(run.epochs[-1]["eval_loss"]) for run in runs
                        if run.epochs[-1].get("eval_loss") is not None]
        curve = _curve(runs)
        reached = next((e + 1 for e, a in enumerate(curve) if a >= study.target_accuracy), None)
        mean_bytes = statistics.fmean(run.mean_bytes_per_step for run in runs)
        workers = runs[0].figures["towers"]
        predicted = {}
        for scale in study.scales:
            figures = runs[0].predictions[scale.label]
            epoch_seconds = statistics.fmean(r.predictions[scale.label]["epoch_seconds"]
                                             for r in runs)
            predicted[scale.label] = {
                "reduction_ms": figures["reduction_ms"],
                "step_ms": statistics.fmean(r.predictions[scale.label]["step_ms"] for r in runs),
                "epoch_seconds": epoch_seconds,
                "epochs_to_target": reached,
                "seconds_to_target": None if reached is None else reached * epoch_seconds,
            }
        out.append({
            "reducer": reducer,
            "seeds": len(runs),
            "final_accuracy": statistics.fmean(finals),
            "final_accuracy_spread": statistics.pstdev(finals) if len(finals) > 1 else 0.0,
            "final_perplexity": statistics.fmean(perplexities) if perplexities else None,
            "final_perplexity_spread": (statistics.pstdev(perplexities)
                                        if len(perplexities) > 1 else 0.0),
            "best_accuracy": max(curve),
            "bytes_per_step": runs[0].bytes_per_step,
            "mean_bytes_per_step": mean_bytes,
            "declared_bytes": runs[0].declared_bytes,
            "bytes_vs_exact": mean_bytes / base,
            "workers": workers,
            # What one worker sends in an epoch, as if each were its own device.
            "bytes_per_worker_per_epoch": (mean_bytes / workers
                                           * runs[0].figures["steps_per_epoch"]),
            "state_bytes": runs[0].state_bytes,
            "step_ms_here": 1e3 * statistics.fmean(run.step_seconds for run in runs),
            "predicted": predicted,
        })
    return out


def table(study) -> str:
    """The summary as text: accuracy and bytes, then the predictions per scale."""
    summary = rows(study)
    width = max(12, *(len(r["reducer"]) for r in summary)) + 2
    text = study.held_out == "perplexity"
    lines = [
        f"{'reducer':<{width}}{'final accuracy':>17}" + (f"{'perplexity':>18}" if text else "")
        + f"{'best':>8}{'bytes/step':>13}{'vs exact':>10}{'MB/worker/ep':>14}"
        f"{'state bytes':>13}{'step here':>11}"
    ]
    for r in summary:
        spread = f"{r['final_accuracy']:.4f} ± {r['final_accuracy_spread']:.4f}"
        perplexity = (f"{r['final_perplexity']:.3f} ± {r['final_perplexity_spread']:.3f}"
                      if text and r["final_perplexity"] is not None else "")
        lines.append(
            f"{r['reducer']:<{width}}{spread:>17}" + (f"{perplexity:>18}" if text else "")
            + f"{r['best_accuracy']:>8.4f}{r['mean_bytes_per_step']:>13,.0f}"
            f"{r['bytes_vs_exact']:>9.3f}x{r['bytes_per_worker_per_epoch'] / 1e6:>14.2f}"
            f"{r['state_bytes']:>13,}{r['step_ms_here']:>8.1f} ms"
        )
    for scale in study.scales:
        lines += ["", f"predicted on {scale.label} (time to eval accuracy "
                      f"{study.target_accuracy:.4f}):",
                  f"{'reducer':<{width}}{'reduction':>12}{'step':>10}{'epoch':>10}"
                  f"{'to target':>16}"]
        for r in summary:
            p = r["predicted"][scale.label]
            reached = ("not reached" if p["seconds_to_target"] is None else
                       f"{p['seconds_to_target']:.2f} s ({p['epochs_to_target']} ep)")
            lines.append(f"{r['reducer']:<{width}}{p['reduction_ms']:>9.2f} ms"
                         f"{p['step_ms']:>7.1f} ms{p['epoch_seconds']:>8.2f} s{reached:>16}")
    return "\n".join(lines)


def chart(study, path: str) -> None:
    """Held-out accuracy against epochs, cumulative bytes and, per scale,
    predicted wall time: one line per reducer (the mean over the seeds), the
    seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 + len(study.scales)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.8), squeeze=False)
    axes = axes[0]
    for reducer, runs in _by_reducer(study).items():
        epochs = min(len(run.epochs) for run in runs)
        per_seed = [[run.epochs[e].get("eval_accuracy") or 0.0 for e in range(epochs)]
                    for run in runs]
        mean = [statistics.fmean(v) for v in zip(*per_seed)]
        low, high = [min(v) for v in zip(*per_seed)], [max(v) for v in zip(*per_seed)]
        steps = [sum(run.epochs[e]["steps"] for e in range(k + 1)) for k in range(epochs)
                 for run in runs[:1]]
        xs = [list(range(1, epochs + 1)),
              [s * runs[0].mean_bytes_per_step / 1e6 for s in steps]]
        xs += [[(k + 1) * runs[0].predictions[s.label]["epoch_seconds"] for k in range(epochs)]
               for s in study.scales]
        for ax, x in zip(axes, xs):
            [line] = ax.plot(x, mean, marker="o", markersize=3, label=reducer)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
    titles = ["by epoch", "by megabytes sent (here)",
              *(f"by predicted time on {s.label}" for s in study.scales)]
    xlabels = ["epoch", "MB sent between devices", *("seconds" for _ in study.scales)]
    for ax, title, xlabel in zip(axes, titles, xlabels):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.axhline(study.target_accuracy, color="grey", linewidth=0.8, linestyle=":")
    axes[1].set_xscale("log")  # compressed reducers send 1/50 of the exact mean, or less
    axes[0].set_ylabel("held-out accuracy")
    axes[-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def front(points: list[tuple[float, float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the points no other point beats on both counts: less or as
    much cost (x) and a better or as good figure (y), one strictly; by cost.

    Args:
      points: (cost, figure) pairs.
      higher_is_better: accuracy (True) or perplexity (False).

    Returns:
      The indices of the points on the front, by cost.
    """
    sign = 1 if higher_is_better else -1

    def beats(a, b):
        return (a[0] <= b[0] and sign * a[1] >= sign * b[1]
                and (a[0] < b[0] or sign * a[1] > sign * b[1]))

    kept = [i for i, p in enumerate(points) if not any(beats(q, p) for q in points)]
    return sorted(kept, key=lambda i: points[i][0])


def pareto(study, path: str) -> None:
    """The final held-out figure of each method (mean over the seeds, the
    spread as a bar) against the bytes one worker sends per epoch (log
    scale) and, per scale, the predicted time of a step; the Pareto front
    drawn through the methods nothing beats on both.

    Args:
      study: the Study.
      path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = rows(study)
    perplexity = study.held_out == "perplexity"
    key = "final_perplexity" if perplexity else "final_accuracy"
    ys = [r[key] for r in summary]
    spreads = [r[f"{key}_spread"] for r in summary]
    costs = [[r["bytes_per_worker_per_epoch"] / 1e6 for r in summary]]
    costs += [[r["predicted"][s.label]["step_ms"] for r in summary] for s in study.scales]
    titles = ["by bytes a worker sends per epoch",
              *(f"by predicted step on {s.label}" for s in study.scales)]
    xlabels = ["MB per worker per epoch (log)", *("ms per step" for _ in study.scales)]
    fig, axes = plt.subplots(1, len(costs), figsize=(5.2 * len(costs), 4.4), squeeze=False)
    for ax, xs, title, xlabel in zip(axes[0], costs, titles, xlabels):
        kept = front(list(zip(xs, ys)), higher_is_better=not perplexity)
        ax.plot([xs[i] for i in kept], [ys[i] for i in kept], color="black", linewidth=1,
                linestyle="--", label="Pareto front", zorder=1)
        for i, r in enumerate(summary):
            ax.errorbar(xs[i], ys[i], yerr=spreads[i], fmt="o", markersize=5, capsize=2,
                        markeredgecolor="black" if i in kept else "none", zorder=2)
            ax.annotate(r["reducer"], (xs[i], ys[i]), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_xscale("log")
    axes[0][0].set_ylabel("held-out perplexity (lower is better)" if perplexity
                          else "held-out accuracy")
    axes[0][0].legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(study) -> None:
    """`study.json` (every run and the summary), `table.txt`, `study.png` (by
    epoch, bytes and time) and `pareto.png` (figure against cost) in `study.out`."""
    data = {"reducers": study.reducers, "seeds": study.seeds,
            "held_out": study.held_out,
            "scales": [dataclasses.asdict(s) | {"label": s.label} for s in study.scales],
            "target_accuracy": study.target_accuracy, "summary": rows(study),
            "runs": [dataclasses.asdict(run) for run in study.runs]}
    with open(os.path.join(study.out, "study.json"), "w") as stream:
        json.dump(data, stream, indent=1)
    with open(os.path.join(study.out, "table.txt"), "w") as stream:
        stream.write(table(study) + "\n")
    chart(study, os.path.join(study.out, "study.png"))
    pareto(study, os.path.join(study.out, "pareto.png"))
