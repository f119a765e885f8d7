"""The replay's charts as PNGs: the timeline (GPUs in use per type and throughput over time, per
policy) and the (time, cost) points of a comparison with ours' Pareto front."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sailor_core.replay.result import ReplayResult
from sailor_core.traces import AvailabilityTrace

_H = 3600.0


def _steps(points, end_s):
    """Step-function samples (x, y) from change points, held until the next one."""
    xs, ys = [], []
    for i, (t, y) in enumerate(points):
        t_next = points[i + 1][0] if i + 1 < len(points) else end_s
        xs += [t / _H, t_next / _H]
        ys += [y, y]
    return xs, ys


def _visible(points, end_s):
    """Drops points that last under 1/1000 of the plot (checkpoint pauses of seconds)."""
    out = []
    for i, p in enumerate(points):
        t_next = points[i + 1].time_s if i + 1 < len(points) else end_s
        if out and i + 1 < len(points) and t_next - p.time_s < end_s / 1000:
            continue
        out.append(p)
    return out


def plot_timeline(results: Mapping[str, ReplayResult], path: str | Path, *,
                  trace: AvailabilityTrace | None = None, title: str = "") -> Path:
    import matplotlib  # lazy: matplotlib (~0.3 s) only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as matplotlib, and after choosing its backend

    names = list(results)
    end_s = max(r.end_s for r in results.values()) or 1.0
    types = sorted({g for r in results.values() for p in r.timeline for g in p.gpus_by_type})
    colors = {g: plt.cm.tab10(i % 10) for i, g in enumerate(types)}
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 2.6 * len(names) + 0.6), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        r = results[name]
        timeline = _visible(list(r.timeline), end_s)
        bottom_pts = [(p.time_s, 0) for p in timeline]
        for g in types:
            pts = [(p.time_s, p.gpus_by_type.get(g, 0)) for p in timeline]
            xs, lo = _steps(bottom_pts, end_s)
            _, hi = _steps([(t, b + n) for (t, b), (_, n) in zip(bottom_pts, pts)], end_s)
            ax.fill_between(xs, lo, hi, color=colors[g], alpha=0.55, linewidth=0, label=f"{g} in use")
            bottom_pts = [(t, b + n) for (t, b), (_, n) in zip(bottom_pts, pts)]
        if trace is not None:
            avail = [(t, sum(c.values())) for t, c in trace.rows if t <= end_s]
            xs, ys = _steps(avail, end_s)
            ax.plot(xs, ys, color="0.5", linestyle="--", linewidth=0.8, label="available (all types)")
        ax.set_ylabel("GPUs")
        ax2 = ax.twinx()
        xs, ys = _steps([(p.time_s, p.throughput_samples_per_s) for p in timeline], end_s)
        ax2.plot(xs, ys, color="black", linewidth=1.0, label="throughput")
        ax2.set_ylabel("samples/s")
        ax2.set_ylim(bottom=0)
        status = (f"{r.time_to_train_s / _H:.1f} h" if r.time_to_train_s is not None
                  else f"stopped ({r.stop_reason.split(':')[0]})")
        ax.set_title(f"{name}: {status}, {r.usd_spent:,.0f} USD, {r.num_replans} re-plans, "
                     f"{r.num_restarts} restarts, useful work {r.useful_work_fraction:.0%}", fontsize=9)
        handles, labels = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(handles + h2, labels + l2, loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("time (h)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_points(comparison, path: str | Path, *, title: str = "") -> Path:
    """Each replay of a ``compare.Comparison`` as a (time to train, USD) point, ours' Pareto front
    over objectives and deadlines as a line; policies that did not finish are listed below."""
    import matplotlib  # lazy: matplotlib (~0.3 s) only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as matplotlib, and after choosing its backend

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    markers = {"ours": "o", "single-type": "s", "skypilot": "^", "static": "D"}
    for name in sorted({p.policy for p in comparison.points}):
        pts = [p for p in comparison.points if p.policy == name and p.finished and p.time_h is not None]
        if pts:
            ax.scatter([p.time_h for p in pts], [p.usd for p in pts], marker=markers.get(name, "x"), s=36,
                       label=name, alpha=0.8)
    front = comparison.front
    if front:
        ax.plot([p.time_h for p in front], [p.usd for p in front], color="C0", linewidth=1.2,
                label="ours: Pareto front")
        for p in front:
            ax.annotate(p.terms.split(" (")[0], (p.time_h, p.usd), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    unfinished = [f"{p.policy} ({p.terms}): not finished, {p.usd:,.0f} USD" for p in comparison.points
                  if not p.finished]
    if unfinished:
        ax.text(0.01, 0.01, "\n".join(unfinished[:6]), transform=ax.transAxes, fontsize=6, va="bottom")
    ax.set_xlabel("time to train (h)")
    ax.set_ylabel("USD")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
