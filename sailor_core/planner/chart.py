"""The cost/throughput Pareto chart (matplotlib is imported only when a chart is drawn)."""

from __future__ import annotations

from pathlib import Path

from sailor_core.errors import InputError
from sailor_core.planner.result import PlanResult


def write_pareto_png(result: PlanResult, path: str | Path, *, title: str = "") -> Path:
    """Draw every evaluated plan's Pareto front (USD/iteration vs samples/s) and mark the chosen plans."""
    # lazy: matplotlib (about a second) only when a chart is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    xs = [p.usd_per_iteration for p in result.pareto]
    ys = [p.throughput_samples_per_s for p in result.pareto]
    ax.step(xs, ys, where="post", color="tab:blue", alpha=0.6)
    ax.scatter(xs, ys, s=14, color="tab:blue", label="Pareto front (evaluated plans)")
    cx = [c.usd_per_iteration for c in result.candidates]
    cy = [c.throughput_samples_per_s for c in result.candidates]
    ax.scatter(cx, cy, s=40, marker="*", color="tab:red", label="returned plans", zorder=3)
    ax.set_xlabel("USD per iteration")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(title or f"objective: {result.objective}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise InputError(f"cannot write Pareto chart {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)
    return path
