"""A job's curves for people: loss and validation loss over steps, samples/s and spend over time.

The job keeps a bounded history of (time, step) points (``with_step_time``: at most
``MAX_POINTS``, thinned by halving so old and new stay evenly sampled); losses and validation
losses are the job state's own.  ``curves_png`` draws them, attempts and preemptions marked:
the chart of the job's status card in the Prefect UI (``tasks/reporting.py``).
"""

from __future__ import annotations

import bisect
import dataclasses
import io
import math
from collections.abc import Sequence
from typing import Any

from sailor_core.controller.ledger import CostLedger

MAX_POINTS = 500  # per curve: a chart of a few hundred pixels shows no more


def thin(points: Sequence, max_points: int = MAX_POINTS) -> tuple:
    """At most ``max_points`` of ``points``, evenly spaced, the first and last kept."""
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, not {max_points}")
    n = len(points)
    if n <= max_points:
        return tuple(points)
    stride = (n - 1) / (max_points - 1)
    return tuple(points[round(i * stride)] for i in range(max_points))


def with_step_time(points: tuple[tuple[float, int], ...], unix_s: float, step: int) -> tuple[tuple[float, int], ...]:
    """``points`` with ``(unix_s, step)`` added when the step changed; past ``MAX_POINTS``, halved
    to points evenly spaced in time (by index, old points would thin faster than new ones)."""
    if points and points[-1][1] == step:
        return points
    out = points + ((float(unix_s), int(step)),)
    if len(out) <= MAX_POINTS:
        return out
    times = [t for t, _ in out]
    n = MAX_POINTS // 2
    picks = {bisect.bisect_left(times, times[0] + (times[-1] - times[0]) * i / (n - 1)) for i in range(n)}
    return tuple(out[i] for i in sorted(picks))


def samples_per_s(points: Sequence[tuple[float, int]], samples_per_step: int,
                  breaks: Sequence[float] = ()) -> list[tuple[float, float]]:
    """(time, samples/s) between consecutive points; none across a restart (the step went back, or
    a time of ``breaks``, an attempt's start, lies between them: a NaN there breaks the line)."""
    out: list[tuple[float, float]] = []
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if s1 <= s0 or t1 <= t0 or any(t0 < b <= t1 for b in breaks):
            if out and not math.isnan(out[-1][1]):
                out.append(((t0 + t1) / 2, math.nan))
            continue
        out.append(((t0 + t1) / 2, (s1 - s0) * samples_per_step / (t1 - t0)))
    return out


def spent_usd_at(instances: Sequence[Any], unix_s: float) -> float:
    """What the job had spent at ``unix_s``: its instance records as they stood then, on the ledger."""
    then = [dataclasses.replace(i, ended_unix_s=min(i.ended_unix_s or unix_s, unix_s))
            for i in instances if i.launched_unix_s <= unix_s]
    return CostLedger.from_instance_records(then).spent_usd(unix_s)


def curves_png(state: Any, now_unix_s: float) -> bytes:  # a JobState (job/state.py imports this module)
    """Two panels: loss and validation loss over steps (attempts marked at the step they resumed
    from); samples/s and USD spent over minutes since the first launch (attempts and preemptions marked)."""
    import matplotlib  # lazy: matplotlib (~0.3 s), only when a chart is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as matplotlib, and after choosing its backend

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(9, 3), dpi=72)
    _loss_panel(by_step, state)
    _time_panel(by_time, state, now_unix_s)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _loss_panel(ax, state: Any) -> None:
    if state.losses:
        xs, ys = zip(*thin(state.losses))
        ax.plot(xs, ys, lw=1, label="loss")
    if state.val_losses:
        xs, ys = zip(*thin(state.val_losses))
        ax.plot(xs, ys, "o-", ms=3, lw=1, label="validation loss")
    for r in state.replans[1:]:
        ax.axvline(r.at_step, color="grey", ls="--", lw=0.8)
        ax.annotate(f"attempt {r.attempt}", (r.at_step, 1), xycoords=("data", "axes fraction"),
                    fontsize=7, va="top", rotation=90)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if state.losses or state.val_losses:
        ax.legend(loc="upper right", fontsize=7)


def _time_panel(ax, state: Any, now_unix_s: float) -> None:
    t0 = min((i.launched_unix_s for i in state.instances), default=state.created_unix_s)

    def minutes(t: float) -> float:
        return (t - t0) / 60

    samples_per_step = (state.plan or {}).get("global_batch_size") or state.spec.global_batch_size or 1
    rates = samples_per_s(state.step_times, samples_per_step, [r.at_unix_s for r in state.replans[1:]])
    if rates:
        xs, ys = zip(*rates)
        ax.plot([minutes(x) for x in xs], ys, lw=1, color="tab:blue", label="samples/s")
    ax.set_xlabel("minutes since the first launch")
    ax.set_ylabel("samples/s")
    spend = ax.twinx()
    ended = [i.ended_unix_s for i in state.instances if i.ended_unix_s]
    end = now_unix_s if state.running_instances() else max(ended, default=t0)  # spend grows while one runs
    times = sorted({t0, end, *(t for t, _ in state.step_times if t <= end),
                    *ended})
    spend.plot([minutes(t) for t in times], [spent_usd_at(state.instances, t) for t in times], color="tab:green",
               lw=1, label="USD spent")
    spend.set_ylabel("USD spent", color="tab:green")
    for r in state.replans[1:]:
        ax.axvline(minutes(r.at_unix_s), color="grey", ls="--", lw=0.8)
    preempted = sorted({i.ended_unix_s for i in state.instances if i.end_reason == "preempted" and i.ended_unix_s})
    for k, t in enumerate(preempted):
        ax.axvline(minutes(t), color="tab:red", lw=1, label="preemption" if k == 0 else None)
    lines = ax.get_legend_handles_labels()[0] + spend.get_legend_handles_labels()[0]
    ax.legend(handles=lines, loc="upper left", fontsize=7)
