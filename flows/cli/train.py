"""``sailor train``, ``sailor ui``, ``sailor jobs``, ``sailor status``: the job commands.

Prefect, torch and the clouds are imported inside the command bodies, after
``flows.cli.prefect_server`` has chosen the Prefect API (it must precede the import).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, print_json
from flows.cli.job_options import with_job_options
from sailor_core.job.spec import JobSpec

SUMMARY_KEYS = ("status", "steps", "final_loss", "replans", "preemptions", "usd_spent", "budget_usd",
                "instances_left_running")


def register(app: typer.Typer) -> None:
    app.command(name="train")(with_job_options(train))

    @app.command()
    def ui(
        port: int = typer.Option(4200, "--port", help="port to serve on (next free one if taken)"),
        stop: bool = typer.Option(False, "--stop", help="stop the server `sailor ui` started"),
    ) -> None:
        """Start a local Prefect server (SQLite under $SAILOR_HOME/prefect) and print its URL."""
        from flows.cli.prefect_server import prefect_home, start_local_server, stop_local_server

        if stop:
            typer.echo("stopped" if stop_local_server() else "no server was running")
            return
        api_url = start_local_server(port=port)
        typer.echo(api_url.removesuffix("/api") + "/")
        typer.echo(f"(API {api_url}; database and log under {prefect_home()}; "
                   "`sailor train` now runs against it; stop with `sailor ui --stop`)", err=True)

    @app.command()
    def jobs(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """Training jobs known here: status, attempts, steps, spend, recoveries."""
        from sailor_core.job.state import JobStore

        store = JobStore()
        rows = [_job_row(s) for s in store.list()]
        if as_json:
            print_json({"jobs_url": store.root, "jobs": rows})
            return
        from rich.table import Table

        table = Table(title=f"jobs under {store.root}")
        for col in ("job", "model", "status", "steps", "attempts", "preemptions", "USD spent / budget", "running"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["job_id"], r["model"], r["status"], f"{r['steps_done']}/{r['steps_target']}",
                          str(r["attempts"]), str(r["preemptions"]), f"{r['usd_spent']:.4f} / {r['budget_usd']:.2f}",
                          str(r["instances_running"]))
        console().print(table)

    @app.command()
    def status(job_id: str = typer.Argument(..., help="job id (see `sailor jobs`)"),
               as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """One job: attempts, re-plans with their reasons, instances and spend."""
        from sailor_core.job.state import JobStore

        state = JobStore().load(job_id)
        row = _job_row(state)
        row["status_reason"] = state.status_reason
        row["last_checkpoint_step"] = state.last_checkpoint_step
        row["final_loss"] = state.last_loss
        row["val_loss"] = state.last_val_loss
        row["val_loss_step"] = state.val_losses[-1][0] if state.val_losses else None
        row["replans"] = [{"attempt": r.attempt, "at_step": r.at_step, "reason": r.reason,
                           "usd_per_hr": r.usd_per_hr} for r in state.replans]
        by_instance = state.ledger().by_instance(time.time())
        row["instances"] = [{"instance_id": i.instance_id, "zone": i.zone, "instance_type": i.instance_type,
                             "attempt": i.attempt, "end_reason": i.end_reason or "running",
                             "usd": by_instance.get(i.instance_id, 0.0)} for i in state.instances]
        if as_json:
            print_json(row)
            return
        out = console()
        out.print(f"[bold]{state.job_id}[/bold] {state.spec.model}: {state.status} {state.status_reason}")
        val = "" if row["val_loss"] is None else f", val loss {row['val_loss']:.4f} (step {row['val_loss_step']})"
        out.print(f"steps {state.steps_done}/{state.spec.steps}, last checkpoint {state.last_checkpoint_step}, "
                  f"loss {state.last_loss}{val}, spent {row['usd_spent']:.4f} of {state.spec.budget_usd:.2f} USD")
        for r in row["replans"]:
            out.print(f"  attempt {r['attempt']} from step {r['at_step']}: {r['reason']} "
                      f"({r['usd_per_hr']:.3f} USD/h)")
        for i in row["instances"]:
            out.print(f"  {i['instance_id']} {i['zone']} {i['instance_type']} attempt {i['attempt']}: "
                      f"{i['end_reason']}, {i['usd']:.4f} USD")


def train(
    spec: JobSpec,
    *,
    max_gpus_per_zone: int = typer.Option(2, "--max-gpus-per-zone", help="most GPUs of one type per zone"),
    job_id: Optional[str] = typer.Option(None, "--job-id", help="continue this job (or name a new one)"),
    cloud: str = typer.Option(
        "auto", "--cloud", help="auto (real clouds when SAILOR_CLOUDS asks for them, else embedded), embedded, real"),
    deployment: bool = typer.Option(False, "--deployment",
                                    help="trigger the train-job deployment on the Prefect server instead"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Plan, rent, train, survive preemptions and stay within the budget."""
    from flows.cli.prefect_server import configure_prefect_env, would_start_server
    from flows.job_parameters import spec_parameters
    from sailor_core.errors import InputError

    if max_gpus_per_zone < 1:
        raise InputError(f"--max-gpus-per-zone must be at least 1, got {max_gpus_per_zone}")
    if cloud not in ("auto", "embedded", "real"):
        raise InputError(f"--cloud must be auto, embedded or real, got {cloud!r}")
    spec = _with_local_data_resolved(spec)
    params = {**spec_parameters(spec), "job_id": job_id, "cloud": cloud, "max_gpus_per_zone": max_gpus_per_zone}
    out = console()
    if not as_json and not deployment and would_start_server():
        out.print("[dim]starting a local Prefect server (first time ~15-60 s)...[/dim]")
    choice = configure_prefect_env(start_server=not deployment)
    if not as_json:
        out.print(f"[dim]{choice.describe()}[/dim]")
    try:
        if deployment:
            summary = _run_deployment(params, choice, show=not as_json)
        else:
            summary = _run_local(params, show=not as_json)
    except KeyboardInterrupt:
        # Typer turns Ctrl-C into a silent exit 130; say what became of the job. Locally the flow's
        # `finally` has terminated the instances and saved the job as cancelled by now.
        what = ("the flow run goes on on its worker (cancel it in the Prefect UI)" if deployment
                else "job cancelled, its instances terminated (see `sailor jobs`)")
        sys.stderr.write(f"error: interrupted; {what}\n")
        raise typer.Exit(130) from None
    if as_json:
        print_json({k: summary.get(k) for k in (*SUMMARY_KEYS, "job_id", "status_reason", "flow_run_id")})
    else:
        _print_summary(summary)
    if summary.get("status") not in ("succeeded", "stopped_budget"):
        raise typer.Exit(1)


def _with_local_data_resolved(spec: JobSpec) -> JobSpec:
    """A local ``--data`` file must exist, and the job keeps its absolute path (its workers and a
    later ``--job-id`` run start elsewhere)."""
    from sailor_core.errors import InputError

    if spec.dataset == "synthetic" or "://" in spec.dataset:
        return spec
    path = Path(spec.dataset).expanduser()
    if not path.is_file():
        raise InputError(f"--data {spec.dataset!r}: no such file")
    return dataclasses.replace(spec, dataset=str(path.resolve()))


def _job_row(state) -> dict:
    return {
        "job_id": state.job_id, "model": state.spec.model, "status": state.status,
        "steps_done": state.steps_done, "steps_target": state.spec.steps, "attempts": state.attempt,
        "preemptions": state.num_preemptions, "replans": max(0, len(state.replans) - 1),
        "usd_spent": state.usd_spent(), "budget_usd": state.spec.budget_usd,
        "instances_running": len(state.running_instances()), "flow_runs": state.num_flow_runs,
    }


def _run_local(params: dict, *, show: bool) -> dict:
    from flows.train_job import train_job
    from flows.cli.progress import progress_display, quiet_engine_failures

    with quiet_engine_failures(), progress_display(enabled=show, steps=params["steps"]) as finish:
        summary = train_job(**params)
        finish(summary)
        return summary


def _run_deployment(params: dict, choice, *, show: bool) -> dict:
    from flows.deploy_client import run_train_deployment
    from sailor_core.errors import SailorError

    if choice.api_url is None:
        raise SailorError("--deployment needs a running Prefect server: start one with `sailor ui` "
                          "(then `prefect --no-prompt deploy --all` and a worker), or set PREFECT_API_URL")
    return run_train_deployment(params, show=show)


def _print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title=f"job {summary.get('job_id')}: {summary.get('status')}", show_header=False)
    table.add_column("what")
    table.add_column("value")
    loss = summary.get("final_loss")
    rows = [
        ("status", f"{summary.get('status')} {summary.get('status_reason') or ''}".strip()),
        ("steps", str(summary.get("steps"))),
        ("final loss", "-" if loss is None else f"{loss:.4f}"),
        ("re-plans", str(summary.get("replans"))),
        ("preemptions survived", str(summary.get("preemptions"))),
        ("USD spent / budget", f"{summary.get('usd_spent', 0.0):.4f} / {summary.get('budget_usd', 0.0):.2f}"),
        ("instances left running", str(summary.get("instances_left_running"))),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console().print(table)
