"""``sailor simulate``, ``sailor memory`` and ``sailor catalog``: the core model from the command line.

Imports happen inside the commands so ``sailor --help`` stays light.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, fail, parse_layers, print_json
from flows.cli.spec_options import with_spec_options
from sailor_core.errors import InputError, PlanError
from sailor_core.job.report import sig
from sailor_core.specs.memory import MemorySpec

_CATALOGS = ("gpus", "models", "instances")


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:,.2f} GB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def simulate_cmd(
    plan_path: str = typer.Argument(..., metavar="PLAN.json",
                                    help="A plan file (README.md, 'A plan file'; `sailor plan --save` writes one), "
                                         "or what `sailor plan --json` printed; - reads standard input."),
    rank: int = typer.Option(1, "--rank", help="Of a `sailor plan --json` document: which plan (1 = the best)."),
    spot: bool = typer.Option(True, "--spot/--no-spot", help="Price GPUs as spot (else on demand)."),
    as_json: bool = typer.Option(False, "--json", help="Print the simulation's figures as JSON."),
    on_demand: bool = typer.Option(False, "--on-demand", hidden=True),  # the older spelling of --no-spot
) -> None:
    """Simulate one training iteration of a plan: time by part, memory, cost, throughput."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.simulator import simulate

    plan = _load_plan_document(plan_path, rank)
    result = simulate(plan, spot=spot and not on_demand)
    if as_json:
        out = result.to_dict()
        out["plan"] = plan.to_dict()
        print_json(out)
        return
    _print_sim(plan, result)


def _load_plan_document(path: str, rank: int):
    """A plan file, or the plan of rank ``rank`` in a ``sailor plan --json`` document."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.plan.types import load_plan, plan_from_dict

    if path != "-":
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return load_plan(path)  # its one-line error says what is wrong with the file
    else:
        try:
            doc = json.loads(sys.stdin.read())
        except ValueError as exc:
            raise PlanError(f"standard input is not a JSON plan: {exc}") from None
    if isinstance(doc, dict) and "stages" not in doc and isinstance(doc.get("plans"), list):
        plans = doc["plans"]
        if not 1 <= rank <= len(plans):
            raise InputError(f"--rank {rank}: the document has {len(plans)} plan(s)")
        entry = plans[rank - 1]
        doc = entry.get("plan") if isinstance(entry, dict) else None
    return plan_from_dict(doc)


def _print_sim(plan, result) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    con = console()
    con.print(
        f"[bold]{plan.model}[/bold]: {len(plan.stages)} stage(s), {result.num_gpus} GPU(s), "
        f"global batch {plan.global_batch_size}, micro-batch {plan.micro_batch_size} "
        f"({result.num_microbatches} micro-batches), seq {result.seq_len}, regime {result.regime}"
    )
    parts = Table(title="Iteration time")
    parts.add_column("part")
    parts.add_column("time", justify="right")
    parts.add_column("share", justify="right")
    total = result.iteration_time_s
    for name, value in result.breakdown.items():
        parts.add_row(name, _ms(value), f"{100 * value / total:.1f} %" if total else "-")
    parts.add_row("[bold]iteration[/bold]", f"[bold]{_ms(total)}[/bold]", "100 %")
    con.print(parts)

    stages = Table(title="Stages (times per micro-batch)")
    stages.add_column("#", justify="right", no_wrap=True)
    stages.add_column("layers", justify="right", no_wrap=True)
    stages.add_column("GPU x TP, zone", overflow="fold")
    for col in ("mb", "f+b ms", "p2p ms", "sync ms", "GB"):
        stages.add_column(col, justify="right", no_wrap=True)
    for s in result.stages:
        stages.add_row(
            str(s.index), f"{s.layer_start}:{s.layer_end}", _replica_summary(s.replicas),
            str(s.num_microbatches), f"{s.compute_s_per_microbatch * 1e3:,.1f}",
            f"{s.p2p_s_per_microbatch * 1e3:,.1f}", f"{s.dp_sync_s * 1e3:,.1f}",
            f"{s.peak_memory_bytes / 1e9:,.1f}" + ("" if s.fits else " [red]no fit[/red]"),
        )
    con.print(stages)
    con.print(
        f"throughput {result.throughput_samples_per_s:,.2f} samples/s ({result.tokens_per_s:,.0f} tokens/s); "
        f"cost {sig(result.usd_per_iteration)} USD/iteration (GPUs {sig(result.gpu_usd_per_iteration)}, "
        f"egress {sig(result.egress_usd_per_iteration)}), GPUs {result.usd_per_hour:.2f} USD/h; "
        f"bottleneck {result.bottleneck}"
    )
    if result.fits:
        con.print(f"peak memory {_gb(result.peak_memory_bytes)} per GPU: fits")
    else:
        con.print(f"[red]does not fit[/red]: {result.why_not}")


def _replica_summary(replicas) -> str:
    counts: dict[str, int] = {}
    for r in replicas:
        key = f"{r.gpu}x{r.tp_degree} {r.zone}"
        counts[key] = counts.get(key, 0) + 1
    return "\n".join(f"{n}: {key}" if n > 1 else key for key, n in counts.items())


def memory_cmd(
    spec: MemorySpec,
    *,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Peak memory of one GPU holding a stage with K micro-batches in flight, by part, with and
    without each memory lever (recomputation, ZeRO)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog.hf_config import resolve_model
    from sailor_core.simulator.levers import lever_label
    from sailor_core.simulator.simulate import stage_memory_under

    model, gpu, mbs, inflight, tp, dp = resolve_model(spec.model), spec.gpu, spec.mbs, spec.inflight, spec.tp, spec.dp
    span = parse_layers(spec.layers)
    asked = (spec.recompute, spec.zero)
    settings = list(dict.fromkeys([asked, ("none", 0), ("none", 1), ("none", 2), ("selective", 0), ("full", 0)]))
    mems = {lv: stage_memory_under(lv + (dp,), model, gpu, tp, mbs, inflight, span, seq_len=spec.seq_len,
                                   regime=spec.regime, num_microbatches=spec.microbatches) for lv in settings}
    mem = mems[asked]
    if as_json:
        print_json(mem.to_dict() | {"recompute": spec.recompute, "zero": spec.zero, "dp_degree": dp,
                                    "levers": {lever_label(*lv): m.to_dict() for lv, m in mems.items()}})
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    table = Table(title=f"{model} on {gpu} (tp {tp}, micro-batch {mbs}, {inflight} in flight, dp {dp})")
    table.add_column("part")
    for lv in settings:
        table.add_column(lever_label(*lv) + (" (asked)" if lv == asked and len(settings) > 1 else ""),
                         justify="right")
    for name, part in (("weights + grads + optimizer", "state_bytes"),
                       ("activations in flight", "activation_bytes"),
                       ("loss working memory", "loss_working_bytes"),
                       ("backward working memory", "backward_working_bytes"),
                       ("communication buffers", "comm_bytes"),
                       ("optimizer step temporaries", "optimizer_working_bytes"),
                       ("constant overhead", "overhead_bytes"),
                       ("[bold]peak[/bold]", "peak_bytes"),
                       ("GPU memory", "capacity_bytes")):
        table.add_row(name, *(_gb(getattr(mems[lv], part)) for lv in settings))
    table.add_row("fits", *("yes" if mems[lv].fits else "[red]no[/red]" for lv in settings))
    con = console()
    con.print(table)
    if dp == 1 and spec.zero:
        con.print("ZeRO shards over the stage's replicas: with --dp 1 it saves nothing")
    con.print("fits" if mem.fits else "[red]does not fit[/red]")


def catalog_cmd(
    what: str = typer.Argument(..., metavar="gpus|models|instances", help="Which catalog to list."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the GPU, model or cloud-instance catalog."""
    if what not in _CATALOGS:
        raise fail(f"unknown catalog {what!r}; choose one of {', '.join(_CATALOGS)}")
    rows = {"gpus": _gpu_rows, "models": _model_rows, "instances": _instance_rows}[what]()
    if as_json:
        print_json({what: rows})
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    table = Table(title=f"{what} ({len(rows)})")
    columns = _HUMAN[what]
    for title, _ in columns:
        table.add_column(title)
    for row in rows:
        table.add_row(*(fmt(row) for _, fmt in columns))
    console().print(table)


_HUMAN = {
    "gpus": (
        ("GPU", lambda r: r["name"]),
        ("memory", lambda r: f"{r['memory_bytes'] / 2**30:.1f} GiB"),
        ("bf16 TFLOP/s", lambda r: f"{r['peak_bf16_flops'] / 1e12:g}"),
        ("fp32 TFLOP/s", lambda r: f"{r['peak_fp32_flops'] / 1e12:g}"),
        ("HBM GB/s", lambda r: f"{r['memory_bw_bytes_per_s'] / 1e9:g}"),
        ("intra-node", lambda r: f"{r['intra_node_link']} {r['intra_node_bw_bytes_per_s'] / 1e9:g} GB/s"),
        ("GPUs/node", lambda r: ",".join(map(str, r["gpus_per_node"]))),
    ),
    "models": (
        ("model", lambda r: r["name"]),
        ("params", lambda r: f"{r['params'] / 1e9:.3f} B"),
        ("layers", lambda r: str(r["num_layers"])),
        ("hidden", lambda r: str(r["hidden_size"])),
        ("FFN", lambda r: str(r["ffn_size"])),
        ("heads (kv)", lambda r: f"{r['num_heads']} ({r['num_kv_heads']})"),
        ("vocab", lambda r: str(r["vocab_size"])),
        ("seq", lambda r: str(r["seq_len"])),
    ),
    "instances": (
        ("cloud", lambda r: r["cloud"]),
        ("zone", lambda r: r["zone"]),
        ("instance", lambda r: r["instance_type"]),
        ("GPUs", lambda r: f"{r['gpus_per_node']}x {r['gpu']}"),
        ("spot $/h", lambda r: f"{r['spot_usd_per_hr']:.3f}"),
        ("on-demand $/h", lambda r: f"{r['on_demand_usd_per_hr']:.3f}"),
    ),
}


def _gpu_rows() -> list[dict]:
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog.gpus import get_gpu, gpu_names

    return [
        {
            "name": g.name, "memory_bytes": g.memory_bytes, "peak_bf16_flops": g.peak_bf16_flops,
            "peak_fp32_flops": g.peak_fp32_flops, "memory_bw_bytes_per_s": g.memory_bw_bytes_per_s,
            "intra_node_bw_bytes_per_s": g.intra_node_bw_bytes_per_s, "intra_node_link": g.intra_node_link,
            "gpus_per_node": list(g.gpus_per_node),
        }
        for g in map(get_gpu, gpu_names())
    ]


def _model_rows() -> list[dict]:
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog.layers import total_params
    from sailor_core.catalog.models import get_model, model_names

    return [
        {
            "name": m.name, "family": m.family, "params": total_params(m), "num_layers": m.num_layers,
            "num_layer_indices": m.num_layer_indices, "hidden_size": m.hidden_size, "ffn_size": m.ffn_size,
            "num_heads": m.num_heads, "num_kv_heads": m.num_kv_heads, "vocab_size": m.vocab_size,
            "seq_len": m.seq_len,
        }
        for m in map(get_model, model_names())
    ]


def _instance_rows() -> list[dict]:
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog.instances import catalog_offers

    return [
        {
            "cloud": o.cloud, "zone": o.zone, "instance_type": o.instance_type, "gpu": o.gpu,
            "gpus_per_node": o.gpus_per_node, "spot_usd_per_hr": o.spot_usd_per_hr,
            "on_demand_usd_per_hr": o.on_demand_usd_per_hr,
        }
        for o in catalog_offers()
    ]


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("memory")(with_spec_options(MemorySpec)(memory_cmd))
    app.command("catalog")(catalog_cmd)
