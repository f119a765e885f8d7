"""``sailor offers``, ``sailor cloud up|down|status|preempt`` and ``sailor cloud bucket create``: the
clouds from the command line.

Imports happen inside the commands so ``sailor --help`` stays light.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Optional

import typer

from flows.cli.common import console, fail, print_json

cloud_app = typer.Typer(help="The embedded local cloud (moto EC2 + a GCE fake) run standalone.",
                        no_args_is_help=True)
bucket_app = typer.Typer(help="The embedded cloud's buckets (gs://NAME and s3://NAME name the same one).",
                         no_args_is_help=True)


def offers_cmd(
    cloud: Optional[list[str]] = typer.Option(None, "--cloud", help="aws or gcp (repeatable; default both)."),
    gpu: Optional[list[str]] = typer.Option(None, "--gpu", help="GPU type, e.g. A100-40 (repeatable)."),
    region: Optional[list[str]] = typer.Option(None, "--region", help="Only these regions (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print the offers as JSON."),
) -> None:
    """GPU offers per zone with spot and on-demand prices, from the configured clouds."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import describe_mode, get_providers
    from sailor_core.catalog import normalize_gpu_name
    from sailor_core.catalog.instances import price_read

    gpus = [normalize_gpu_name(g) for g in gpu] if gpu else None
    providers = get_providers(cloud or None)
    offers = []
    for provider in providers.values():
        offers.extend(provider.list_offers(gpu_types=gpus, regions=region or None))
    offers.sort(key=lambda o: (o.gpu, o.usd_per_gpu_hr(spot=True), o.cloud, o.zone, o.gpus_per_node))
    if as_json:
        print_json({
            "source": describe_mode(),
            "prices_read": price_read(),
            "offers": [
                {"cloud": o.cloud, "zone": o.zone, "region": o.region, "instance_type": o.instance_type, "gpu": o.gpu,
                 "gpus_per_node": o.gpus_per_node, "spot_usd_per_hr": o.spot_usd_per_hr,
                 "on_demand_usd_per_hr": o.on_demand_usd_per_hr,
                 "spot_usd_per_gpu_hr": round(o.usd_per_gpu_hr(spot=True), 6)}
                for o in offers
            ],
        })
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    table = Table(title=f"GPU offers ({describe_mode()}; list prices as of {price_read()})")
    for col in ("GPU", "cloud", "zone", "instance type", "GPUs/node", "spot $/h", "on-demand $/h", "spot $/GPU-h"):
        table.add_column(col, justify="right" if "$" in col or "GPUs" in col else "left")
    for o in offers:
        table.add_row(o.gpu, o.cloud, o.zone, o.instance_type, str(o.gpus_per_node), f"{o.spot_usd_per_hr:,.4f}",
                      f"{o.on_demand_usd_per_hr:,.4f}", f"{o.usd_per_gpu_hr(spot=True):,.4f}")
    con = console()
    con.print(table)
    con.print(f"{len(offers)} offers in {len({(o.cloud, o.zone) for o in offers})} zones")


@cloud_app.command("up")
def up_cmd(
    notice_s: float = typer.Option(2.0, "--notice-s", help="Seconds between the preemption notice and the kill."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Availability trace that drives capacity."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Trace seconds per real second."),
    faults: str = typer.Option("", "--faults", help="API fault rates, e.g. throttle=0.1,server_error=0.05,seed=1"),
    wait_s: float = typer.Option(90.0, "--wait-s", help="How long to wait for it to serve."),
) -> None:
    """Start the embedded cloud in the background ($SAILOR_HOME/cloud.json holds its endpoints)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import standalone_state, state_file
    from infra.local.faults import parse_fault_rates

    parse_fault_rates(faults)  # bad input fails here, not in the background
    state = standalone_state()
    if state is not None:
        _print_state(state, "already up")
        return
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "infra.local.daemon", "--notice-s", str(notice_s), "--time-scale", str(time_scale)]
    if trace:
        argv += ["--trace", os.path.abspath(trace)]
    if faults:
        argv += ["--faults", faults]
    log = (path.parent / "cloud.log").open("ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # outlives this command
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        state = standalone_state()
        if state is not None:
            _print_state(state, "up")
            return
        if proc.poll() is not None:
            raise fail(f"the embedded cloud exited with code {proc.returncode}; see {path.parent / 'cloud.log'}")
        time.sleep(0.1)
    proc.terminate()  # do not leave a half-started cloud behind
    raise fail(f"the embedded cloud did not answer within {wait_s:.0f} s; see {path.parent / 'cloud.log'}")


def _print_state(state: dict, word: str) -> None:
    console().print(
        f"embedded cloud {word} (pid {state['pid']})\n"
        f"  AWS (moto EC2):  AWS_ENDPOINT_URL={state['aws_endpoint']}\n"
        f"  GCE (fake):      {state['gce_endpoint']}  project {state['project']}\n"
        f"  control:         {state['control_url']}  (its secret: {state.get('control_secret_file')}, 0600)"
        + ("" if state.get("metadata_tells_instances_apart", True) else
           "\n  metadata:        cannot tell instances apart (host network: no namespaces), docs/clouds.md")
    )


@cloud_app.command("down")
def down_cmd(wait_s: float = typer.Option(15.0, "--wait-s")) -> None:
    """Stop the standalone embedded cloud: its instances' processes are killed."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import standalone_state, state_file

    state = standalone_state()
    if state is None:
        state_file().unlink(missing_ok=True)
        console().print("embedded cloud is not running")
        return
    os.kill(int(state["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(int(state["pid"]), 0)
        except ProcessLookupError:
            console().print(f"embedded cloud stopped (pid {state['pid']})")
            return
        time.sleep(0.1)
    raise fail(f"embedded cloud (pid {state['pid']}) did not stop within {wait_s:.0f} s")


@cloud_app.command("status")
def status_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """Endpoints, live instances, capacity limits, faults and preemptions of the standalone cloud."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import standalone_state

    state = standalone_state()
    if state is None:
        if as_json:
            print_json({"running": False})
            return
        raise fail("embedded cloud is not running (start it with 'sailor cloud up')", code=1)
    status = _control(state, "status")
    if as_json:
        # the administrator's keys and the control secret stay in their 0600 files
        shown = {k: v for k, v in state.items() if k not in ("aws_keys", "control_secret")}
        print_json({"running": True, **shown, **status})
        return
    _print_state(state, "up")
    con = console()
    con.print(f"  live instances:  {status['num_live_instances']}")
    for inst in status["live_instances"]:
        con.print(f"    {inst['cloud']} {inst['instance_id']} {inst['zone']} {inst['num_gpus']} x {inst['gpu']}")
    con.print(f"  capacity limits: {status['capacity'] or 'none (unlimited)'}")
    con.print(f"  preemptions:     {len(status['preemptions'])}")


@cloud_app.command("preempt")
def preempt_cmd(
    instance_id: Optional[str] = typer.Argument(None, help="Instance to reclaim."),
    zone: Optional[str] = typer.Option(None, "--zone", help="Reclaim instances in this zone instead."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only instances with this GPU type (with --zone)."),
    num_gpus: Optional[int] = typer.Option(None, "--num-gpus", help="Reclaim until this many GPUs are taken."),
) -> None:
    """Preempt a spot instance (or a zone's) of the standalone cloud, as the cloud would."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import standalone_state
    from sailor_core.catalog import normalize_gpu_name

    if not instance_id and not zone:
        raise fail("give an INSTANCE_ID or --zone")
    state = standalone_state()
    if state is None:
        raise fail("embedded cloud is not running (start it with 'sailor cloud up')", code=1)
    body = {"instance_id": instance_id} if instance_id else {
        "zone": zone, "gpu": normalize_gpu_name(gpu) if gpu else None, "num_gpus": num_gpus}
    out = _control(state, "preempt", body)
    console().print(f"preempting {', '.join(out.get('preempted', [])) or 'nothing'} "
                    f"(notice, then killed)")


@bucket_app.command("create")
def bucket_create_cmd(
    url: str = typer.Argument(..., help="The bucket: gs://NAME or s3://NAME (no path)."),
) -> None:
    """Make a bucket on the embedded cloud, as `gcloud storage buckets create` / `aws s3 mb` on real ones."""
    # lazy: loaded when the command runs (the CLI starts light)
    from infra.config import buckets_dir, real_clouds
    from infra.local.object_store import bucket_name_problem

    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("gs", "s3"):
        raise fail(f"{url!r} is not a bucket URL: give gs://NAME or s3://NAME")
    name, _, path = rest.partition("/")
    if path:
        raise fail(f"{url}: a bucket URL has no path (give {scheme}://{name}; a prefix needs no creating)")
    problem = bucket_name_problem(scheme, name)
    if problem:
        raise fail(problem)
    if real_clouds():
        raise fail("this makes buckets of the embedded cloud; on GCP: gcloud storage buckets create gs://NAME "
                   "--uniform-bucket-level-access, on AWS: aws s3 mb s3://NAME")
    folder = buckets_dir() / name
    if folder.exists():
        raise fail(f"{scheme}://{name} already exists ({folder})", code=1)
    folder.mkdir(parents=True)  # the buckets are rclone's folders: a running cloud serves it within a second
    other = "s3" if scheme == "gs" else "gs"
    console().print(f"created {scheme}://{name} on the embedded cloud ({folder}; {other}://{name} is the same bucket)")


def _control(state: dict, route: str, body: dict | None = None) -> dict:
    from infra.config import control_headers  # lazy: loaded when the command runs (the CLI starts light)

    url = f"{state['control_url']}/{route}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers=control_headers(state))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = json.loads(exc.read() or b"{}").get("error", str(exc))
        raise fail(f"embedded cloud: {detail}") from None


def register(app: typer.Typer) -> None:
    app.command("offers")(offers_cmd)
    cloud_app.add_typer(bucket_app, name="bucket")
    app.add_typer(cloud_app, name="cloud")
