"""``sailor replay``: what training costs and how long it takes on a capacity trace, per policy.

Its options are ReplaySpec's fields (``sailor_core/specs/replay.py``) and the output ones here.
Imports happen inside the command so ``sailor --help`` stays light.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Optional

import typer

from flows.cli.common import console, print_json
from flows.cli.spec_options import with_spec_options
from sailor_core.errors import InputError
from sailor_core.objective import Objective
from sailor_core.specs.replay import ReplaySpec


def replay_cmd(
    spec: ReplaySpec,
    *,
    compare: bool = typer.Option(False, "--compare", help="Also replay ours cheapest, by deadlines, and on each "
                                 "other policy's time (deadline) and spend (budget): the equal-terms comparison."),
    pareto: Optional[str] = typer.Option(None, "--pareto", help="With --compare: write the (time, cost) chart "
                                         "with ours' Pareto front here."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write the timeline PNG here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Replay an availability trace in simulated time under each policy: time to train, USD, re-plans."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog import get_model
    from sailor_core.replay import run_policies
    from sailor_core.traces import load_trace

    if pareto and not compare:
        raise InputError("--pareto draws the comparison: add --compare")
    if compare and (spec.objective is not Objective.THROUGHPUT or spec.deadline_h is not None
                    or spec.min_throughput_samples_per_s):
        raise InputError("--compare sets the objective and deadlines itself: leave out --objective, "
                         "--deadline-h and --min-throughput")
    availability = load_trace(spec.trace, gpu=spec.trace_gpu, zone=spec.trace_zone)
    with _progress_line(quiet=as_json) as on_progress:
        suite = run_policies(availability, spec, progress=on_progress)
    out = suite.to_dict()
    model = get_model(spec.model).name
    if compare:
        out["comparison"] = _compare(availability, spec, pareto, quiet=as_json)
    if plot:
        out["plot"] = _plot(suite, availability, plot, title=f"{model}, {spec.tokens:.3g} tokens on "
                                                              f"{availability.source}")
    if as_json:
        print_json(out)
        return
    _print_suite(out)


def _plot(suite, trace, path: str, *, title: str) -> str:
    """The timeline PNG at ``path`` (returned)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.replay.plot import plot_timeline

    plot_timeline(suite.results, path, trace=trace, title=title)
    return path


def _compare(trace, spec, pareto: str | None, *, quiet: bool) -> dict:
    """``compare_policies`` (ours over objectives and deadlines, and on each policy's terms), its
    lines of words, and its chart when asked."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.replay.compare import compare_policies, summary_lines

    with _progress_line(quiet=quiet) as on_progress:
        say = (lambda text: on_progress(text, 0.0, 0)) if on_progress is not None else None
        c = compare_policies(trace, spec, progress=say)
    out = c.to_dict()
    out["summary"] = summary_lines(c)
    if pareto:
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.replay.plot import plot_points

        plot_points(c, pareto, title=f"{spec.model}, {spec.tokens:.3g} tokens on {trace.source}")
        out["pareto_plot"] = pareto
    return out


@contextlib.contextmanager
def _progress_line(*, quiet: bool):
    """A status line on stderr while the replay runs (where it is in simulated time, and the
    planner searches so far: the slow part of a first replay); nothing under --json or
    when stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return

    # lazy: loaded when the command runs (the CLI starts light)
    from rich.console import Console

    t0, shown = time.monotonic(), [0.0]
    with Console(stderr=True).status("replaying") as status:
        def on_progress(policy: str, t_s: float, num_searches: int) -> None:
            now = time.monotonic()
            if now - shown[0] >= 0.1:  # a few updates a second, not one per trace event
                shown[0] = now
                status.update(f"replaying {policy}: {t_s / 3600:.1f} h simulated, "
                              f"{num_searches} planner searches, {now - t0:.0f} s")

        yield on_progress


def _print_suite(out: dict) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    from sailor_core.replay import activity_words

    con = console()
    con.print(f"trace [bold]{out['trace']}[/bold]; single-type GPU: {out['single_gpu_type'] or '-'}")
    for note in out["trace_notes"]:
        con.print(f"  note: {note}")
    table = Table(title="Replay")
    for col in ("policy", "finished", "time (h)", "USD", "cost/ours", "time/ours", "useful", "re-plans",
                "restarts", "waiting (h)"):
        table.add_column(col, justify="right" if col not in ("policy", "finished") else "left")
    for name, r in out["policies"].items():
        t = r["time_to_train_s"]
        table.add_row(
            name, "yes" if r["finished"] else f"no ({r['stop_reason'].split(':')[0]})",
            f"{t / 3600:,.2f}" if t is not None else "-", f"{r['usd_spent']:,.2f}",
            _fmt_ratio(r.get("cost_ratio_to_ours")), _fmt_ratio(r.get("time_ratio_to_ours")),
            f"{r['useful_work_fraction']:.0%}", str(r["num_replans"]), str(r["num_restarts"]),
            f"{r['wait_s'] / 3600:,.2f}",
        )
    con.print(table)
    for name, r in out["policies"].items():
        interims = r.get("num_interims") or 0
        con.print(f"  {name}: the paid GPU time went to {activity_words(r.get('gpu_s_by_activity') or {})}"
                  + (f"; held GPUs trained while new instances booted in {interims} of {r['num_replans']} changes"
                     if interims else ""))
    con.print(f"replayed in {out['wall_s']:.2f} s ({out['planner_calls']} planner calls, "
              f"{out['planner_time_s']:.2f} s planning)")
    comparison = out.get("comparison")
    if comparison:
        front = Table(title="ours: Pareto front of time and cost (objectives and deadlines)")
        for col in ("terms", "time (h)", "USD", "useful"):
            front.add_column(col, justify="left" if col == "terms" else "right")
        for p in comparison["front"]:
            front.add_row(p["terms"], f"{p['time_h']:,.2f}", f"{p['usd']:,.2f}", f"{p['useful_work_fraction']:.0%}")
        con.print(front)
        for line in comparison["summary"]:
            con.print(line)
        if comparison.get("pareto_plot"):
            con.print(f"chart: {comparison['pareto_plot']}")
    if out.get("plot"):
        con.print(f"timeline: {out['plot']}")


def _fmt_ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def register(app: typer.Typer) -> None:
    app.command("replay")(with_spec_options(ReplaySpec)(replay_cmd))
