"""``sailor profiles list | show | import``: the profile database from the command line.

Imports happen inside the commands so ``sailor --help`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, fail, print_json

_FORMATS = ("sailor", "measurements")

profiles_app = typer.Typer(
    name="profiles",
    help="The profile database: per-layer time and memory of models on GPU types.",
    no_args_is_help=True,
)


def _row(p) -> dict:
    return {
        "model": p.model,
        "gpu": p.gpu,
        "tp": p.tp_degree,
        "mbs": p.micro_batch_size,
        "seq": p.seq_len,
        "regime": p.regime,
        "measured": p.measured,
        "source": p.source,
    }


@profiles_app.command("list")
def list_cmd(
    model: Optional[str] = typer.Option(None, "--model", help="Only this model."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU type."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the stored profiles (shipped with Sailor and in your profiles folder)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog.gpus import normalize_gpu_name
    from sailor_core.catalog.models import normalize_model_name
    from sailor_core.profiles import default_profile_db
    from sailor_core.profiles.store import user_profiles_dir

    want_model = normalize_model_name(model) if model else None
    want_gpu = normalize_gpu_name(gpu) if gpu else None
    rows = [
        _row(p)
        for p in default_profile_db().profiles()
        if (want_model is None or p.model == want_model) and (want_gpu is None or p.gpu == want_gpu)
    ]
    if as_json:
        print_json({"profiles": rows, "user_profiles_dir": str(user_profiles_dir())})
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    # one line per (model, GPU, regime, source): the (tp, mbs) pairs it covers
    groups: dict[tuple, dict[int, list[int]]] = {}
    for r in rows:
        key = (r["model"], r["gpu"], r["seq"], r["regime"], r["source"])
        groups.setdefault(key, {}).setdefault(r["tp"], []).append(r["mbs"])
    table = Table(title=f"{len(rows)} profiles (tp: micro-batch sizes)")
    for column in ("model", "GPU", "seq", "tp: mbs", "regime", "source"):
        table.add_column(column, overflow="fold")
    for (m, g, seq, regime, source), cover in groups.items():
        coverage = "; ".join(f"{tp}: {','.join(map(str, sorted(b)))}" for tp, b in sorted(cover.items()))
        table.add_row(m, g, str(seq), coverage, regime, source)
    console().print(table)


@profiles_app.command("show")
def show_cmd(
    model: str = typer.Option(..., "--model", help="Model name."),
    gpu: str = typer.Option(..., "--gpu", help="GPU type."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    mbs: int = typer.Option(1, "--mbs", help="Micro-batch size (sequences)."),
    seq: Optional[int] = typer.Option(None, "--seq", help="Sequence length (default: the model's)."),
    regime: Optional[str] = typer.Option(None, "--regime", help="Only use data of this training regime."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Per-layer profile of one (model, GPU, TP, micro-batch): measured, or estimated and from what."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.profiles import default_profile_db

    p = default_profile_db().get(model, gpu, tp, mbs, seq, regime=regime)
    layers = [
        {
            "layer": i,
            "fwd_s": l.fwd_s,
            "bwd_s": l.bwd_s,
            "params": l.params,
            "activation_bytes": l.activation_bytes,
            "output_bytes": l.output_bytes,
            "measured": l.measured,
        }
        for i, l in enumerate(p.layers)
    ]
    summary = {
        **_row(p),
        "fwd_bwd_s": p.fwd_bwd_s(),
        "params": p.params(),
        "update_s": p.update_s(p.params()),
        "update_measured": p.update_measured,
        "layers": layers,
    }
    if as_json:
        print_json(summary)
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    con = console()
    con.print(
        f"[bold]{p.model}[/bold] on {p.gpu}, tp {p.tp_degree}, mbs {p.micro_batch_size}, seq {p.seq_len}, "
        f"regime {p.regime}\nsource: {p.source}\nforward+backward {p.fwd_bwd_s() * 1e3:,.2f} ms, "
        f"{p.params() / 1e6:,.1f} M params per GPU, optimizer step {p.update_s(p.params()) * 1e3:,.2f} ms"
    )
    table = Table()
    for column in ("layer", "fwd ms", "bwd ms", "params", "activations", "output", "measured"):
        table.add_column(column, justify="right")
    for r in layers:
        table.add_row(
            str(r["layer"]),
            f"{r['fwd_s'] * 1e3:.3f}",
            f"{r['bwd_s'] * 1e3:.3f}",
            f"{r['params'] / 1e6:,.2f} M",
            f"{r['activation_bytes'] / 1e6:,.1f} MB",
            f"{r['output_bytes'] / 1e6:,.1f} MB",
            "yes" if r["measured"] else "no",
        )
    con.print(table)


@profiles_app.command("import")
def import_cmd(
    path: str = typer.Argument(..., metavar="PATH", help="Sailor's data folder, or a measurements .jsonl (or its folder)."),
    fmt: str = typer.Option(..., "--format", help="sailor | measurements"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU type of a measurements file (default: its env.device)."),
    name: Optional[str] = typer.Option(None, "--name", help="File name in your profiles folder (default: from PATH)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Import external profiles into your profiles folder ($SAILOR_HOME/profiles or ~/.sailor/profiles)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.profiles.default import write_user_profiles

    if fmt not in _FORMATS:
        raise fail(f"unknown --format {fmt!r}; choose one of {', '.join(_FORMATS)}")
    source = Path(path)
    if fmt == "sailor":
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.profiles.import_sailor import import_sailor

        profiles = import_sailor(source)
    else:
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.profiles.import_measurements import import_measurements

        profiles = import_measurements(source, gpu=gpu)
    out = write_user_profiles(name or f"{fmt}-{source.resolve().name}", profiles)
    keys = sorted({(p.model, p.gpu) for p in profiles})
    if as_json:
        print_json({"imported": len(profiles), "path": str(out), "models_gpus": [list(k) for k in keys]})
        return
    console().print(
        f"imported {len(profiles)} profiles ({', '.join(f'{m} on {g}' for m, g in keys)}) into {out}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(profiles_app, name="profiles")
