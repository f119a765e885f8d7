"""``sailor replay``: what training costs and how long it takes on a capacity trace, per policy.

Imports happen inside the command so ``sailor --help`` stays light.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Optional

import typer

from flows.cli.common import console, print_json
from sailor_core.errors import InputError


def _parse_tokens(text: str) -> float:
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
    global_batch_size: Optional[int] = typer.Option(None, "--global-batch-size",
                                                    help="Sequences per iteration (default 1024)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type of the skypilot/single-type policies "
                                      "(default: the fastest at the start)."),
    prices: Optional[str] = typer.Option(None, "--prices", help="Spot price series CSV (USD per GPU-hour)."),
    trace_gpu: Optional[str] = typer.Option(None, "--trace-gpu", help="GPU type of a one-pool trace whose file name does not say."),
    trace_zone: Optional[str] = typer.Option(None, "--trace-zone", help="Zone of a one-pool trace whose file name does not say."),
    provisioning_s: float = typer.Option(90.0, "--provisioning-s", help="Spot request to running VM."),
    startup_s: float = typer.Option(60.0, "--startup-s", help="Worker start-up and rendezvous."),
    rejoin_s: float = typer.Option(10.0, "--rejoin-s", help="A change onto instances all held: their parked "
                                   "workers re-form the job in place (no new processes)."),
    storage_gbps: float = typer.Option(1.0, "--storage-gb-per-s", help="Checkpoint store bandwidth (GB/s)."),
    checkpoint_interval_s: float = typer.Option(1800.0, "--checkpoint-interval-s", help="Periodic checkpoints."),
    exact: bool = typer.Option(False, "--exact-availability", help="Plan on exact counts (slower; default rounds pools to a 1/8 grid)."),
    seed: int = typer.Option(0, "--seed", help="Seed of which of our GPUs a preemption picks."),
    plan_cache: Optional[str] = typer.Option(None, "--plan-cache", help="JSON file keeping the planner's answers "
                                             "between replays (delete it after changing planner or profiles)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes that search the next re-plans ahead "
                                          "(default: one per idle CPU up to 8, none if fewer than two are idle; 0: none). "
                                          "Results do not depend on it."),
    objective: str = typer.Option("throughput", "--objective", help="What the job asks: throughput (finish "
                                  "soonest) or cost (finish for the fewest USD); every policy but skypilot re-plans by it."),
    min_throughput: Optional[float] = typer.Option(None, "--min-throughput", help="Throughput floor (samples/s, "
                                                   "counting restarts) for the cost objective."),
    deadline_h: Optional[float] = typer.Option(None, "--deadline-h", help="Finish within this many hours of the "
                                               "trace's start (with --objective cost: the cheapest plans that do)."),
    on_demand_gpus: int = typer.Option(0, "--on-demand-gpus", help="On-demand GPUs per pool of the trace the "
                                       "policies may rent besides spot (never preempted; skypilot rents spot only)."),
    compare: bool = typer.Option(False, "--compare", help="Also replay ours cheapest, by deadlines, and on each "
                                 "other policy's time (deadline) and spend (budget): the equal-terms comparison."),
    pareto: Optional[str] = typer.Option(None, "--pareto", help="With --compare: write the (time, cost) chart "
                                         "with ours' Pareto front here."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write the timeline PNG here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", hidden=True),  # older spelling
) -> None:
    """Replay an availability trace in simulated time under each policy: time to train, USD, re-plans."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog import get_model
    from sailor_core.replay import (POLICIES, ChangeCosts, JobTerms, checkpoint_bytes_for, load_price_series,
                                    run_policies)
    from sailor_core.traces import load_trace

    names = _policy_names(policy, POLICIES)
    _check_options(workers=workers, pareto=pareto, compare=compare)
    terms = JobTerms(objective=objective.strip().lower(), min_throughput_samples_per_s=min_throughput,
                     deadline_h=deadline_h, on_demand_gpus=on_demand_gpus)
    spec = get_model(model)
    num_tokens = _parse_tokens(tokens)
    costs = ChangeCosts(
        provisioning_s=provisioning_s, startup_s=startup_s, rejoin_s=rejoin_s,
        checkpoint_interval_s=checkpoint_interval_s,
        checkpoint_bytes=checkpoint_bytes_for(spec.name), storage_bw_bytes_per_s=storage_gbps * 1e9,
    )
    availability = load_trace(trace, gpu=trace_gpu, zone=trace_zone)
    run_args = dict(global_batch_size=global_batch if global_batch is not None else global_batch_size, costs=costs,
                    gpu_type=gpu, prices=load_price_series(prices) if prices else None, seed=seed,
                    exact_availability=exact, plan_cache_path=plan_cache, workers=workers)
    with _progress_line(quiet=as_json) as on_progress:
        suite = run_policies(availability, model=spec.name, tokens=num_tokens, policies=names, budget_usd=budget_usd,
                             progress=on_progress, terms=terms, **run_args)
    out = suite.to_dict()
    if compare:
        out["comparison"] = _compare(availability, spec.name, num_tokens, names, terms, pareto, run_args,
                                     quiet=as_json)
    if plot:
        out["plot"] = _plot(suite, availability, plot, title=f"{spec.name}, {num_tokens:.3g} tokens on "
                                                               f"{availability.source}")
    if as_json:
        print_json(out)
        return
    _print_suite(out)


def _policy_names(policy: str, known) -> list[str]:
    """``--policy``: a comma list of the known policies, or all."""
    names = list(known) if policy.strip() == "all" else [p.strip() for p in policy.split(",") if p.strip()]
    for p in names:
        if p not in known:
            raise InputError(f"unknown policy {p!r}; known: {', '.join(known)} or all")
    return names


def _check_options(*, workers: int | None, pareto: str | None, compare: bool) -> None:
    if workers is not None and workers < 0:
        raise InputError(f"--workers must be 0 or more, got {workers}")
    if pareto and not compare:
        raise InputError("--pareto draws the comparison: add --compare")


def _plot(suite, trace, path: str, *, title: str) -> str:
    """The timeline PNG at ``path`` (returned)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.replay.plot import plot_timeline

    plot_timeline(suite.results, path, trace=trace, title=title)
    return path


def _compare(trace, model: str, tokens: float, policies, terms, pareto: str | None, run_args: dict, *,
             quiet: bool) -> dict:
    """``compare_policies`` (ours over objectives and deadlines, and on each policy's terms), its
    lines of words, and its chart when asked."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.replay.compare import compare_policies, summary_lines

    if terms.objective != "throughput" or terms.deadline_h is not None or terms.min_throughput_samples_per_s:
        raise InputError("--compare sets the objective and deadlines itself: leave out --objective, "
                         "--deadline-h and --min-throughput")
    with _progress_line(quiet=quiet) as on_progress:
        say = (lambda text: on_progress(text, 0.0, 0)) if on_progress is not None else None
        c = compare_policies(trace, model=model, tokens=tokens, policies=policies,
                             on_demand_gpus=terms.on_demand_gpus, progress=say, **run_args)
    out = c.to_dict()
    out["summary"] = summary_lines(c)
    if pareto:
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.replay.plot import plot_points

        plot_points(c, pareto, title=f"{model}, {tokens:.3g} tokens on {trace.source}")
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
    app.command("replay")(replay_cmd)
