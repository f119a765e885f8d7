"""``sailor engine run``: train a plan on local processes (CPU, gloo) and report loss and throughput."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, print_json
from sailor_core.errors import InputError
from sailor_core.job.spec import spec_field

LR = spec_field("learning_rate")  # `sailor train --lr`: its default and help are a job's

engine_app = typer.Typer(help="Run the training engine on this machine.", no_args_is_help=True)


@engine_app.command("run")
def run_cmd(
    plan: Path = typer.Option(..., "--plan", help="plan file (replicas with \"gpu\": \"cpu\")"),
    steps: int = typer.Option(..., "--steps", min=1, help="optimizer steps to train"),
    reference: bool = typer.Option(False, "--reference",
                                   help="also train the same samples in one process and compare"),
    data: Optional[str] = typer.Option(None, "--data", help=".npy/.bin/.u32.bin token file: a path, file://, s3:// "
                                                           "or gs:// URL (default: a synthetic corpus)"),
    ckpt_dir: Optional[str] = typer.Option(None, "--ckpt-dir", help="checkpoint URL (dir or s3://)"),
    ckpt_every: int = typer.Option(0, "--ckpt-every", min=0),
    resume: bool = typer.Option(False, "--resume", help="continue from the latest valid checkpoint"),
    lr: float = typer.Option(LR.default, *LR.cli_names, help=LR.option.help),
    seed: int = typer.Option(0, "--seed"),
    timeout_s: float = typer.Option(900.0, "--timeout", help="give up after this many seconds"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Train PLAN on local worker processes, print per-step loss and throughput."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.plan.types import load_plan

    p = load_plan(plan)  # bad input fails before torch is imported
    if data is not None:
        _check_data(data)
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.runtime.engine_run import run_plan
    from sailor_core.runtime.recipe import make_recipe

    recipe = make_recipe(steps, {LR.name: lr})  # a bad value stops here, naming --lr

    workdir = Path(tempfile.mkdtemp(prefix="sailor-engine-"))
    out = run_plan(p, steps, workdir=workdir, data=data, ckpt_dir=ckpt_dir, ckpt_every=ckpt_every,
                   resume=resume, recipe=recipe, seed=seed, reference=reference, timeout_s=timeout_s)
    if json_out:
        print_json(out)
    else:
        _print_table(out)
    if out["status"] != "ok":
        raise typer.Exit(1)


def _check_data(data: str) -> None:
    """The same URLs as `sailor train --data`; a local file must exist (a URL is read by the workers)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.job.spec import JobSpecError, check_dataset

    try:
        check_dataset(data)
    except JobSpecError as exc:
        raise InputError(f"--data {exc.problem}") from None
    local = data.removeprefix("file://")
    if "://" not in local and not Path(local).exists():
        raise InputError(f"--data {data!r}: no such file")


def _print_table(out: dict) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    c = console()
    table = Table(title=f"engine run: {out['status']}")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    if "reference_losses" in out:
        table.add_column("reference loss", justify="right")
    table.add_column("step time (s)", justify="right")
    table.add_column("samples/s", justify="right")
    for i, step in enumerate(out["steps"]):
        row = [str(step), f"{out['losses'][i]:.6f}"]
        if "reference_losses" in out:
            row.append(f"{out['reference_losses'][i]:.6f}")
        dt = out["step_times_s"][i]
        row += [f"{dt:.3f}", f"{out['global_batch_size'] / dt:.1f}"]
        table.add_row(*row)
    c.print(table)
    c.print(f"throughput: {out['throughput_samples_per_s']:.1f} samples/s, "
            f"{out['tokens_per_s']:.0f} tokens/s (median step, {out['world_size']} processes)")
    if "max_param_diff" in out:
        c.print(f"reference: max_param_diff {out['max_param_diff']:.3e}, "
                f"max_loss_diff {out['max_loss_diff']:.3e}")
    if out.get("message"):
        c.print(f"[red]{out['message']}[/red]")


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
