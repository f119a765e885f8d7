"""``sailor plan``: the ranked plans for a model over the GPUs available per type and zone.

Its options are PlanSpec's fields (``sailor_core/specs/plan.py``) and the output ones here.
Only Typer is imported at module level; the planner (numpy, no torch, no Prefect)
is imported inside the command so ``sailor plan`` starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, print_json
from flows.cli.spec_options import with_spec_options
from sailor_core.errors import InputError
from sailor_core.job.report import sig
from sailor_core.specs.plan import PlanSpec


def plan_cmd(
    spec: PlanSpec,
    *,
    pareto: Optional[str] = typer.Option(None, "--pareto", help="Write the cost/throughput Pareto chart to this PNG."),
    save: Optional[Path] = typer.Option(None, "--save", help="Write the best plan to this file, for `sailor "
                                                             "simulate` and `sailor engine run` (README: 'A plan file')."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: the ranked plans and their figures."),
) -> None:
    """Find the best plans: micro-batch, stages, uneven layer split, replicas, TP and zones."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.planner import make_request, parse_gpu_list, plan_job

    if (spec.gpus is None) == (spec.trace is None):
        raise InputError("give exactly one of --gpus and --trace")
    if spec.gpus is not None:
        _check_gpu_list_syntax(spec.gpus)
        availability = parse_gpu_list(spec.gpus)
    else:
        availability = _trace_row(spec.trace, spec.row)
    request = make_request(
        model=spec.model,
        availability=availability,
        objective=spec.objective,
        global_batch_size=spec.global_batch_size,
        max_usd_per_iteration=spec.max_usd_per_iter,
        max_usd_per_hour=spec.max_usd_per_hr,
        min_throughput_samples_per_s=spec.min_throughput_samples_per_s,
        top_n=spec.top,
        spot=spec.spot,
        max_stages=spec.max_stages,
        memory_levers=spec.memory_levers,
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
            "; ".join(f"{s.layer_start}:{s.layer_end} {_replicas(s)}{_levers(s)}" for s in plan.stages),
            f"{cand.sim.peak_memory_bytes / 1e9:,.1f}",
        )
    con.print(table)
    best = result.candidates[0]
    con.print("GPUs used by the best plan: " + ", ".join(f"{k}={n}" for k, n in best.gpus_by_type_zone().items()))
    for note in best.notes:
        con.print(f"memory: {note}")
    if pareto:
        con.print(f"Pareto chart ({len(result.pareto)} points) written to {pareto}")
    if save is not None:
        con.print(f"best plan written to {save} (`sailor simulate {save}`)")


def _levers(stage) -> str:
    """A stage's memory levers as the table shows them (none: nothing)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.simulator.levers import lever_label

    label = lever_label(stage.recompute, stage.zero_stage)
    return f" ({label})" if label != "none" else ""


def _replicas(stage) -> str:
    counts: dict[tuple, int] = {}
    for r in stage.replicas:
        key = (r.gpu, r.tp_degree, r.zone)
        counts[key] = counts.get(key, 0) + 1
    return " + ".join(f"{n}x{g}/tp{tp}@{z}" for (g, tp, z), n in counts.items())


def register(app: typer.Typer) -> None:
    app.command("plan")(with_spec_options(PlanSpec)(plan_cmd))
