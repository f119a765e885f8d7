"""``sailor replay``: what training costs and how long it takes on a capacity trace, per policy.

Imports happen inside the command so ``sailor --help`` stays light.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Optional

import typer

from flows.cli.common import console, print_json


def _parse_tokens(text: str) -> float:
    from sailor_core.errors import InputError

    t = text.strip().lower().replace("_", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if t[-1:] in "kmbgt" else t) * scale
    except ValueError:
        raise InputError(f"--tokens must be a number like 2e9 or 500M, got {text!r}") from None
    if not value > 0:
        raise InputError(f"--tokens must be positive, got {text!r}")
    return value


def replay_cmd(
    trace: str = typer.Option(..., "--trace", help="Sailor GPU-trace CSV, a spot_traces file (formats A-D), "
                              "or derived:aws-3d / derived:gcp-4d[:SEED]."),
    model: str = typer.Option(..., "--model", help="Model name, e.g. opt-350m."),
    tokens: str = typer.Option(..., "--tokens", help="Tokens to train, e.g. 2e10 or 20B."),
    policy: str = typer.Option("all", "--policy", help="ours | skypilot | single-type | static | all (comma list ok)."),
    budget_usd: Optional[float] = typer.Option(None, "--budget-usd", help="Stop before spending more than this."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per iteration (default 1024)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type of the skypilot/single-type policies "
                                      "(default: the fastest at the start)."),
    prices: Optional[str] = typer.Option(None, "--prices", help="Spot price series CSV (USD per GPU-hour)."),
    trace_gpu: Optional[str] = typer.Option(None, "--trace-gpu", help="GPU type of a one-pool trace whose file name does not say."),
    trace_zone: Optional[str] = typer.Option(None, "--trace-zone", help="Zone of a one-pool trace whose file name does not say."),
    provisioning_s: float = typer.Option(90.0, "--provisioning-s", help="Spot request to running VM."),
    startup_s: float = typer.Option(60.0, "--startup-s", help="Worker start-up and rendezvous."),
    storage_gbps: float = typer.Option(1.0, "--storage-gb-per-s", help="Checkpoint store bandwidth (GB/s)."),
    checkpoint_interval_s: float = typer.Option(1800.0, "--checkpoint-interval-s", help="Periodic checkpoints."),
    exact: bool = typer.Option(False, "--exact-availability", help="Plan on exact counts (slower; default rounds pools to a 1/8 grid)."),
    seed: int = typer.Option(0, "--seed", help="Seed of which of our GPUs a preemption picks."),
    plan_cache: Optional[str] = typer.Option(None, "--plan-cache", help="JSON file keeping the planner's answers "
                                             "between replays (delete it after changing planner or profiles)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes that search the next re-plans ahead "
                                          "(default: one per idle CPU up to 8, none if fewer than two are idle; 0: none). "
                                          "Results do not depend on it."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write the timeline PNG here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Replay an availability trace in simulated time under each policy: time to train, USD, re-plans."""
    from sailor_core.catalog import get_model
    from sailor_core.errors import InputError
    from sailor_core.replay import POLICIES, ChangeCosts, checkpoint_bytes_for, load_price_series, run_policies
    from sailor_core.traces import load_trace

    names = list(POLICIES) if policy.strip() == "all" else [p.strip() for p in policy.split(",") if p.strip()]
    for p in names:
        if p not in POLICIES:
            raise InputError(f"unknown policy {p!r}; known: {', '.join(POLICIES)} or all")
    if workers is not None and workers < 0:
        raise InputError(f"--workers must be 0 or more, got {workers}")
    spec = get_model(model)
    num_tokens = _parse_tokens(tokens)
    costs = ChangeCosts(
        provisioning_s=provisioning_s, startup_s=startup_s, checkpoint_interval_s=checkpoint_interval_s,
        checkpoint_bytes=checkpoint_bytes_for(spec.name), storage_bw_bytes_per_s=storage_gbps * 1e9,
    )
    availability = load_trace(trace, gpu=trace_gpu, zone=trace_zone)
    series = load_price_series(prices) if prices else None
    with _progress_line(quiet=as_json) as on_progress:
        suite = run_policies(
            availability, model=spec.name, tokens=num_tokens, policies=names, global_batch_size=global_batch,
            budget_usd=budget_usd, costs=costs, gpu_type=gpu, prices=series, seed=seed, exact_availability=exact,
            plan_cache_path=plan_cache, workers=workers, progress=on_progress,
        )
    out = suite.to_dict()
    if plot:
        from sailor_core.replay.plot import plot_timeline

        plot_timeline(suite.results, plot, trace=availability,
                      title=f"{spec.name}, {num_tokens:.3g} tokens on {availability.source}")
        out["plot"] = plot
    if as_json:
        print_json(out)
        return
    _print_suite(out)


@contextlib.contextmanager
def _progress_line(*, quiet: bool):
    """A status line on stderr while the replay runs (where it is in simulated time, and the
    planner searches so far: the slow part of a first replay); nothing under --json or
    when stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    import time

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
    from rich.table import Table

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
    con.print(f"replayed in {out['wall_s']:.2f} s ({out['planner_calls']} planner calls, "
              f"{out['planner_time_s']:.2f} s planning)")
    if out.get("plot"):
        con.print(f"timeline: {out['plot']}")


def _fmt_ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
