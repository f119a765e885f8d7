"""``sailor plan``: the ranked plans for a model over the GPUs available per type and zone.

Only Typer is imported at module level; the planner (numpy, no torch, no Prefect)
is imported inside the command so ``sailor plan`` starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, print_json
from sailor_core.errors import InputError
from sailor_core.job.report import sig


def plan_cmd(
    model: str = typer.Option(..., "--model", help="Model name, e.g. opt-350m."),
    gpus: Optional[str] = typer.Option(
        None, "--gpus", help="GPUs available: 'A100-40@us-central1-a=32,V100-16@us-central1-a=96'."),
    trace: Optional[str] = typer.Option(
        None, "--trace", help="Take availability from a Sailor GPU trace CSV (with --row)."),
    row: int = typer.Option(0, "--row", help="Row of --trace to plan for (0-based, after merging repeats)."),
    objective: str = typer.Option("throughput", "--objective", help="throughput | cost"),
    max_usd_per_iter: Optional[float] = typer.Option(None, "--max-usd-per-iter", help="Cost cap, USD per iteration."),
    max_usd_per_hr: Optional[float] = typer.Option(None, "--max-usd-per-hr", help="Cost cap, USD per hour."),
    min_throughput: Optional[float] = typer.Option(
        None, "--min-throughput",
        help="Throughput floor in samples (sequences) per second = iterations/s x global batch."),
    global_batch_size: Optional[int] = typer.Option(None, "--global-batch-size",
                                                    help="Sequences per iteration (default 1024)."),
    top: int = typer.Option(5, "--top", help="How many plans to return."),
    pareto: Optional[str] = typer.Option(None, "--pareto", help="Write the cost/throughput Pareto chart to this PNG."),
    save: Optional[Path] = typer.Option(None, "--save", help="Write the best plan to this file, for `sailor "
                                                             "simulate` and `sailor engine run` (README: 'A plan file')."),
    spot: bool = typer.Option(True, "--spot/--no-spot", help="Price GPUs as spot (else on demand)."),
    max_stages: int = typer.Option(16, "--max-stages", help="Most pipeline stages to consider."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: the ranked plans and their figures."),
    # Older spellings, hidden: the options above are spelled as in `sailor train`.
    max_usd_per_hour: Optional[float] = typer.Option(None, "--max-usd-per-hour", hidden=True),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", hidden=True),
    on_demand: bool = typer.Option(False, "--on-demand", hidden=True),
) -> None:
    """Find the best plans: micro-batch, stages, uneven layer split, replicas, TP and zones."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.planner import make_request, parse_gpu_list, plan_job

    max_usd_per_hr = max_usd_per_hour if max_usd_per_hour is not None else max_usd_per_hr
    global_batch_size = global_batch if global_batch is not None else global_batch_size
    spot = spot and not on_demand
    if (gpus is None) == (trace is None):
        raise InputError("give exactly one of --gpus and --trace")
    if gpus is not None:
        _check_gpu_list_syntax(gpus)
        availability = parse_gpu_list(gpus)
    else:
        availability = _trace_row(trace, row)
    if max_stages < 1:
        raise InputError(f"--max-stages must be at least 1, got {max_stages}")
    request = make_request(
        model=model,
        availability=availability,
        objective=objective,
        global_batch_size=global_batch_size,
        max_usd_per_iteration=max_usd_per_iter,
        max_usd_per_hour=max_usd_per_hr,
        min_throughput_samples_per_s=min_throughput,
        top_n=top,
        spot=spot,
        max_stages=max_stages,
        collect_pareto=pareto is not None,
    )
    result = plan_job(request)
    if pareto:
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.planner.chart import write_pareto_png

        write_pareto_png(result, pareto, title=f"{request.model}, {request.total_gpus} GPUs available")
    if save is not None:
        _save_plan(result, save)
    if as_json:
        out = result.to_dict()
        out["model"] = request.model
        out["global_batch_size"] = request.global_batch_size
        out["available"] = {f"{g}@{z}": n for (g, z), n in request.availability.items()}
        print_json(out)
        return
    _print_result(request, result, pareto, save)


def _check_gpu_list_syntax(text: str) -> None:
    """The likely typo, said as such: ``T4:us-central1-a=2`` for ``T4@us-central1-a=2``."""
    for item in (p.strip() for p in text.split(",")):
        name = item.partition("=")[0]
        if ":" in name and "@" not in name:
            gpu, _, zone = name.partition(":")
            raise InputError(f"--gpus item {item!r}: a zone follows its GPU after '@', not ':' "
                             f"(did you mean '{gpu}@{zone}={item.partition('=')[2]}'?)")


def _save_plan(result, path: Path) -> None:
    try:
        path.write_text(json.dumps(result.candidates[0].plan.to_dict(), indent=2) + "\n")
    except OSError as exc:
        raise InputError(f"--save {str(path)!r}: {exc.strerror or exc}") from None


def _trace_row(path: str, row: int) -> dict:
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.traces import load_gpu_trace

    trace = load_gpu_trace(path)
    if not 0 <= row < trace.num_rows:
        raise InputError(f"--row {row} is out of range: {path} has rows 0..{trace.num_rows - 1}")
    return {key: n for key, n in trace.row(row).items() if n > 0}


def _print_result(request, result, pareto: str | None, save: Path | None) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    con = console()
    con.print(
        f"[bold]{request.model}[/bold]: {request.total_gpus} GPUs available, objective {request.objective.value}, "
        f"global batch {request.global_batch_size}; searched in {result.search_time_s:.2f} s "
        f"({result.num_evaluated} plans evaluated{'' if result.exhausted else ', stopped by patience/budget'})"
    )
    table = Table(title="Plans (best first)")
    for col in ("#", "samples/s", "USD/iter", "USD/h", "GPUs", "mbs", "stages (layers: replicas)", "peak GB"):
        table.add_column(col, justify="right" if col != "stages (layers: replicas)" else "left", overflow="fold")
    for i, cand in enumerate(result.candidates):
        plan = cand.plan
        table.add_row(
            str(i + 1), f"{cand.throughput_samples_per_s:,.2f}", sig(cand.usd_per_iteration),
            f"{cand.sim.usd_per_hour:,.2f}", str(plan.num_gpus), str(plan.micro_batch_size),
            "; ".join(f"{s.layer_start}:{s.layer_end} {_replicas(s)}" for s in plan.stages),
            f"{cand.sim.peak_memory_bytes / 1e9:,.1f}",
        )
    con.print(table)
    best = result.candidates[0]
    con.print("GPUs used by the best plan: " + ", ".join(f"{k}={n}" for k, n in best.gpus_by_type_zone().items()))
    if pareto:
        con.print(f"Pareto chart ({len(result.pareto)} points) written to {pareto}")
    if save is not None:
        con.print(f"best plan written to {save} (`sailor simulate {save}`)")


def _replicas(stage) -> str:
    counts: dict[tuple, int] = {}
    for r in stage.replicas:
        key = (r.gpu, r.tp_degree, r.zone)
        counts[key] = counts.get(key, 0) + 1
    return " + ".join(f"{n}x{g}/tp{tp}@{z}" for (g, tp, z), n in counts.items())


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
