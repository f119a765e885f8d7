"""``sailor train``, ``sailor ui``, ``sailor jobs``, ``sailor status``: the job commands.

Every argument is checked before anything starts (JobSpec's fields against their catalogs,
then the run's own options): a bad one is an ``error:`` line within a fraction of a second,
with no Prefect or torch loaded, no server started, no job or flow run created.
Prefect, torch and the clouds are imported inside the command bodies, after
``flows.cli.prefect_server`` has chosen the Prefect API (it must precede the import).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from flows.cli.common import console, print_json
from flows.cli.spec_options import with_spec_options
from flows.cli.stop import GracefulStop
from sailor_core.errors import InputError, SailorError
from sailor_core.job import report
from sailor_core.job.spec import JobSpec, check_names

SUMMARY_KEYS = ("status", "steps", "final_loss", "replans", "preemptions", "usd_spent", "budget_usd",
                "instances_left_running")
CLOUDS = ("auto", "embedded", "real")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
JOB_PANEL = "Job (what to train, where, within what budget)"


def register(app: typer.Typer) -> None:
    app.command(name="train")(with_spec_options(JobSpec, panel=JOB_PANEL, check=check_names,
                                                continues=_continued)(train))
    app.command(name="ui")(ui)
    app.command(name="jobs")(jobs)
    app.command(name="status")(status)


def train(
    spec: JobSpec,
    *,
    max_gpus_per_zone: int = typer.Option(2, "--max-gpus-per-zone", help="most GPUs of one type per zone"),
    job_id: Optional[str] = typer.Option(None, "--job-id", help="continue this job (or name a new one)"),
    cloud: str = typer.Option(
        "auto", "--cloud", help="auto (real clouds when SAILOR_CLOUDS asks for them, else embedded), embedded, real"),
    deployment: bool = typer.Option(False, "--deployment",
                                    help="run it through the train-job deployment (set up by `sailor deploy`)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
) -> None:
    """Plan, rent, train, survive preemptions and stay within the budget."""
    if max_gpus_per_zone < 1:
        raise InputError(f"--max-gpus-per-zone must be at least 1, got {max_gpus_per_zone}")
    if cloud not in CLOUDS:
        raise InputError(f"--cloud must be auto, embedded or real, got {cloud!r}")
    if job_id is not None and not _JOB_ID.fullmatch(job_id):
        raise InputError(f"--job-id {job_id!r}: use letters, digits, '.', '_' and '-' (at most 100), "
                         "starting with a letter or digit")
    spec = _with_local_data_resolved(spec)
    _check_before_renting(spec, cloud=cloud, max_gpus_per_zone=max_gpus_per_zone)
    # lazy: loaded when the command runs (the CLI starts light)
    from flows.cli.prefect_server import configure_prefect_env, would_start_server
    from flows.cli.progress import live_display
    from flows.spec_parameters import spec_parameters
    from sailor_core.job.state import JobStore, new_job_id

    # Named here, so the flow run's name and its job_id parameter say which job it is.
    job_id = job_id or new_job_id(spec.model)
    params = {**spec_parameters(spec), "job_id": job_id, "cloud": cloud, "max_gpus_per_zone": max_gpus_per_zone}
    out = console()
    if not as_json and not deployment and would_start_server():
        out.print("[dim]starting a local Prefect server (first time ~15-60 s)...[/dim]")
    choice = configure_prefect_env(start_server=not deployment)
    if not as_json and choice.source in ("started", "ephemeral"):
        out.print(f"[dim]{choice.describe()}[/dim]", highlight=False)
    with live_display(enabled=not as_json, steps=spec.steps) as display:
        store = JobStore()
        store.clear_stop(job_id)  # this command starts the job anew: an older request (say, of a dead run) is done
        ctrl_c = GracefulStop(store, job_id, say=display.event if not as_json else _say)
        ctrl_c.install()
        try:
            summary = (_run_deployment(params, choice, display) if deployment else _run_local(params, display))
        except KeyboardInterrupt:
            # Stopped at once (a second Ctrl-C, the grace over): locally the flow's `finally` has terminated the
            # instances and saved the job as cancelled by now; a deployment's run was cancelled through the API.
            summary = _summary_after_interrupt(job_id)
        finally:
            ctrl_c.uninstall()
    if as_json:
        print_json({k: summary.get(k) for k in (*SUMMARY_KEYS, "job_id", "status_reason", "flow_run_id",
                                                "flow_run_url")})
    else:
        _print_summary(summary)
    if ctrl_c.requested:
        raise typer.Exit(130)  # as an interrupted command exits
    if summary.get("status") not in ("succeeded", "stopped_budget"):
        raise typer.Exit(1)


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")


def _summary_after_interrupt(job_id: str) -> dict:
    """The job's summary as its store has it after a stop at once."""
    # lazy: prefect's task machinery, once the job has run
    from sailor_core.job.state import JobStore
    from tasks.jobs import summary as job_summary

    store = JobStore()
    if not store.exists(job_id):
        return {"job_id": job_id, "status": "cancelled", "status_reason": "stopped before the job started",
                "steps": 0}
    job = store.load(job_id)
    return job_summary(job, instances_left_running=len(job.running_instances()))


def _continued(run_only: dict, given: dict, spelled: dict) -> JobSpec | None:
    """``--job-id`` of a job that exists: its own settings, with ``--budget-usd``/``--steps`` raised
    where given (said in one line); any other option that differs from the job's is refused."""
    job_id = run_only.get("job_id")
    if not job_id or not _JOB_ID.fullmatch(job_id):
        return None
    # lazy: the job store, only for --job-id
    from sailor_core.job.spec import JobSpecError, continued_spec, raised_words
    from sailor_core.job.state import JobStore

    store = JobStore()
    if not store.exists(job_id):
        return None
    recorded = store.load(job_id).spec
    if "dataset" in given:
        given["dataset"] = _with_local_data_resolved(dataclasses.replace(recorded, dataset=given["dataset"])).dataset
    try:
        spec = continued_spec(recorded, given)
    except JobSpecError as exc:
        raise InputError(f"{spelled.get(exc.field, exc.field)} {exc.problem}") from None
    raised = raised_words(recorded, spec)
    sys.stderr.write(f"job {job_id} continues with its own settings" + (f"; {raised}" if raised else "") + "\n")
    return spec


def _with_local_data_resolved(spec: JobSpec) -> JobSpec:
    """A local ``--data`` file must exist, and the job keeps its absolute path (its workers and a
    later ``--job-id`` run start elsewhere)."""
    if spec.dataset == "synthetic" or "://" in spec.dataset:
        return spec
    path = Path(spec.dataset).expanduser()
    if not path.is_file():
        raise InputError(f"--data {spec.dataset!r}: no such file")
    return dataclasses.replace(spec, dataset=str(path.resolve()))


def _check_before_renting(spec: JobSpec, *, cloud: str, max_gpus_per_zone: int) -> None:
    """``flows.prerent``'s checks, before the flow is submitted; the field named as its option."""
    # lazy: the planner's profiles and the clouds' configuration, loaded when the command runs
    from flows.prerent import check_before_renting
    from sailor_core.job.spec import JobSpecError, spec_field

    try:
        check_before_renting(spec, cloud=cloud, max_gpus_per_zone=max_gpus_per_zone)
    except JobSpecError as exc:
        raise InputError(f"{spec_field(exc.field).cli_name} {exc.problem}") from None


def _run_local(params: dict, display) -> dict:
    # lazy: loaded when the command runs (the CLI starts light)
    from flows.cli.progress import quiet_engine_failures
    from flows.train_job import train_job
    from tasks.reporting import add_event_listener, remove_event_listener
    from tasks.workers import add_progress_listener, remove_progress_listener

    add_progress_listener(display.state)
    add_event_listener(display.on_job_event)
    try:
        with quiet_engine_failures():
            final = train_job(**params, return_state=True)
    finally:
        remove_event_listener(display.on_job_event)
        remove_progress_listener(display.state)
    if not final.is_cancelled():
        summary = final.result()  # the flow's summary; a failure raises as it did (its one error line)
    else:  # a stop: the job as its store has it
        summary = _summary_after_interrupt(params["job_id"])
    display.finish(summary)
    return summary


def _run_deployment(params: dict, choice, display) -> dict:
    # lazy: loaded when the command runs (the CLI starts light)
    from flows.deploy_client import run_train_deployment

    if choice.api_url is None:
        raise SailorError("--deployment needs a Prefect server with Sailor's deployments: run `sailor deploy "
                          "--worker` (or set PREFECT_API_URL to a server that has them)")
    summary = run_train_deployment(params, display=display)
    display.finish(summary)
    return summary


def _print_summary(summary: dict) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    table = Table(title=f"job {summary.get('job_id')}: {summary.get('status')}", show_header=False)
    table.add_column("what")
    table.add_column("value", overflow="fold")
    loss = summary.get("final_loss")
    rows = [
        ("status", f"{summary.get('status')} {summary.get('status_reason') or ''}".strip()),
        ("steps", str(summary.get("steps"))),
        ("final loss", "-" if loss is None else f"{loss:.4f}"),
        ("re-plans", str(summary.get("replans"))),
        ("preemptions survived", str(summary.get("preemptions"))),
        ("USD spent / budget", f"{summary.get('usd_spent', 0.0):.4f} / {summary.get('budget_usd', 0.0):.2f}"),
        ("instances left running", str(summary.get("instances_left_running"))),
        ("flow run", summary.get("flow_run_url") or summary.get("flow_run_id") or "-"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console().print(table)


# ---- sailor ui / jobs / status -----------------------------------------------------------------


def ui(
    port: int = typer.Option(4200, "--port", help="port to serve on (next free one if taken)"),
    stop: bool = typer.Option(False, "--stop", help="stop the server (and the worker) Sailor started"),
) -> None:
    """Start a local Prefect server (SQLite under $SAILOR_HOME/prefect) and print its URL."""
    # lazy: loaded when the command runs (the CLI starts light)
    from flows.cli.prefect_server import (PROFILE, ensure_local_server, prefect_home, previous_profile,
                                          stop_local_server, ui_url)
    from flows.cli.worker import stop_worker

    if stop:
        worker = stop_worker()
        active = stop_local_server()
        typer.echo("stopped " + " and ".join(w for w, did in (("the worker", worker), ("the server", active)) if did)
                   + (f"; the Prefect profile {active!r} is active" if active else "")
                   if worker or active else "no server was running")
        return
    api_url, started = ensure_local_server(port=port)
    was = previous_profile()
    typer.echo(ui_url(api_url))
    typer.echo(f"({'started' if started else 'already running'}; API {api_url}; database and log under "
               f"{prefect_home()}; the Prefect profile {PROFILE!r} is active" + (f" (was {was!r})" if was else "")
               + ", so plain `prefect` commands and `sailor train` use this server; `sailor ui --stop` stops it"
               + (f" and makes {was!r} active again)" if was else ")"), err=True)


def _job_row(state) -> dict:
    return {
        "job_id": state.job_id, "model": state.spec.model, "status": state.status,
        "started_unix_s": state.created_unix_s, "started": report.local_time(state.created_unix_s),
        "steps_done": state.steps_done, "steps_target": state.spec.steps, "attempts": state.attempt,
        "preemptions": state.num_preemptions, "replans": max(0, len(state.replans) - 1),
        "usd_spent": state.usd_spent(), "budget_usd": state.spec.budget_usd,
        "instances_running": len(state.running_instances()), "flow_runs": state.num_flow_runs,
        "flow_run_id": state.flow_run_id, "flow_run_url": state.flow_run_url,
    }


def jobs(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Training jobs known here: when they started, status, steps, spend, their flow run in the UI."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.job.state import JobStore

    store = JobStore()
    rows = [_job_row(s) for s in store.list()]
    if as_json:
        print_json({"jobs_url": store.root, "jobs": rows})
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    table = Table(title=f"jobs under {store.root}")
    for col in ("job", "started", "status", "steps", "attempts", "USD spent / budget", "flow run"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["job_id"], r["started"], r["status"], f"{r['steps_done']}/{r['steps_target']}",
                      f"{r['attempts']} ({r['preemptions']} preempted)",
                      f"{report.sig(r['usd_spent'])} / {report.sig(r['budget_usd'])}",
                      r["flow_run_url"] or r["flow_run_id"] or "-")
    console().print(table)


def status(job_id: str = typer.Argument(..., help="job id (see `sailor jobs`)"),
           as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """One job: when it started, its flow run, attempts and re-plans with their reasons, instances, spend."""
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.job.state import JobStore

    state = JobStore().load(job_id)
    row = _job_row(state)
    row["status_reason"] = state.status_reason
    row["last_checkpoint_step"] = state.last_checkpoint_step
    row["last_checkpoint_url"] = state.last_checkpoint.url if state.last_checkpoint else None
    row["last_checkpoint_unix_s"] = state.last_checkpoint.at_unix_s if state.last_checkpoint else None
    row["final_loss"] = state.last_loss
    row["val_loss"] = state.last_val_loss
    row["val_loss_step"] = state.val_losses[-1][0] if state.val_losses else None
    row["replans"] = [{"attempt": r.attempt, "at_step": r.at_step, "reason": r.reason,
                       "usd_per_hr": r.usd_per_hr, "num_ranks": r.num_ranks,
                       "num_ranks_rejoined": r.num_ranks_rejoined, "num_ranks_standby": r.num_ranks_standby,
                       "ready_s": r.ready_s,
                       "state_from": r.state_from} for r in state.replans]
    ledger, now = state.ledger(), time.time()
    by_instance = ledger.by_instance(now)
    row["usd_rent"], row["usd_egress"] = ledger.rent_usd(now), ledger.egress_usd()
    row["usd_checkpoint_egress"] = ledger.checkpoint_egress_usd()  # of usd_egress
    row["egress"] = [{"from": src, "to": dst, "bytes": b, "usd": c} for (src, dst), (b, c) in
                     sorted(ledger.egress_by_pair().items())]
    row["instances"] = [{"instance_id": i.instance_id, "zone": i.zone, "instance_type": i.instance_type,
                         "attempt": i.attempt, "end_reason": i.end_reason or "running",
                         "usd": by_instance.get(i.instance_id, 0.0)} for i in state.instances]
    if as_json:
        print_json(row)
        return
    out = console()
    out.print(f"[bold]{state.job_id}[/bold] {state.spec.model}: {state.status} {state.status_reason}")
    out.print(f"started {row['started']}; flow run {state.flow_run_id or '-'}"
              + (f": {state.flow_run_url}" if state.flow_run_url else ""), highlight=False)
    val = "" if row["val_loss"] is None else f", val loss {row['val_loss']:.4f} (step {row['val_loss_step']})"
    where = f" at {row['last_checkpoint_url']}" if row["last_checkpoint_url"] else ""
    out.print(f"steps {state.steps_done}/{state.spec.steps}, "
              f"{report.checkpoint_words(state.last_checkpoint_step, row['last_checkpoint_unix_s'])}{where}, "
              f"loss {report.sig(state.last_loss, 4)}{val}, spent "
              f"{report.spend(row['usd_spent'], state.spec.budget_usd)} "
              f"({report.rent_and_egress(row['usd_rent'], row['usd_egress'], row['usd_checkpoint_egress'])})",
              highlight=False)
    for e in row["egress"]:
        out.print(f"  egress {e['from']} -> {e['to']}: {report.sig(e['bytes'] / 1e9)} GB, {report.usd(e['usd'])}",
                  highlight=False)
    for r in row["replans"]:
        how = report.restart_words(num_ranks=r["num_ranks"], num_ranks_rejoined=r["num_ranks_rejoined"],
                                   num_ranks_standby=r["num_ranks_standby"],
                                   ready_s=r["ready_s"], state_from=r["state_from"])
        out.print(f"  attempt {r['attempt']} from step {r['at_step']}: {r['reason']} "
                  f"({report.sig(r['usd_per_hr'])} USD/h){f'; {how}' if how else ''}", highlight=False)
    for i in row["instances"]:
        out.print(f"  {i['instance_id']} {i['instance_type']} in {i['zone']}, attempt {i['attempt']}: "
                  f"{i['end_reason']}, {report.usd(i['usd'])}", highlight=False)
    for line in _tensorboard_hint(state, JobStore()):
        out.print(line, highlight=False, soft_wrap=True)


def _tensorboard_hint(state, store) -> list[str]:
    """How to read the job's curves: on a real cloud at the job's URL (gs:// needs gcsfs, TensorBoard's
    way to GCS without TensorFlow); on the embedded cloud its event files are plain files under the
    Sailor home (its buckets' folder), and over S3 while a standalone cloud serves them (its GCS
    front speaks the XML API, not the JSON API gcsfs does: gs:// is that same folder)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import buckets_dir, real_clouds, standalone_state, state_file
    from tasks.embedded_bucket import EMBEDDED_BUCKET

    if not state.spec.tensorboard:
        return []
    if real_clouds():
        url = f"{store.job_url(state.job_id)}/tensorboard"
        if url.startswith("gs://"):
            return [f"curves: pip install 'sailor[gcs]' (gcsfs), then tensorboard --logdir {url}"]
        return [f"curves: tensorboard --logdir {url}"]
    folder = buckets_dir() / EMBEDDED_BUCKET / state.job_id / "tensorboard"
    if not folder.is_dir():
        return []
    lines = [f"curves: tensorboard --logdir {folder}"]
    cloud = standalone_state()
    if cloud is not None:
        key_id, _ = cloud["aws_keys"]  # the secret stays in the cloud's state file, not on the screen
        lines.append(f"  or over S3: S3_ENDPOINT={cloud['aws_endpoint']} AWS_ACCESS_KEY_ID={key_id} "
                     f"AWS_SECRET_ACCESS_KEY=<aws_keys[1] of {state_file()}> AWS_REGION=us-east-1 "
                     f"tensorboard --logdir s3://{EMBEDDED_BUCKET}/{state.job_id}/tensorboard")
    else:
        lines.append("  (over S3 too while `sailor cloud up` serves the buckets: `sailor status` then says how)")
    return lines
