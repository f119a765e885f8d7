"""``sailor profile`` (a model's layers on this machine) and ``sailor profile network``.

Their options are ProfileSpec's and NetworkProfileSpec's fields (``sailor_core/specs/profile.py``)
and the run-only ones here.  Both write into the user's folders ($SAILOR_HOME or ~/.sailor:
``profiles/``, ``network/``), which the profile database and the network model read.  torch is
imported inside the commands.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from flows.cli.common import console, print_json
from flows.cli.spec_options import with_spec_options
from flows.spec_parameters import spec_parameters
from sailor_core.errors import InputError
from sailor_core.specs.profile import NetworkProfileSpec, ProfileSpec

profile_app = typer.Typer(
    name="profile",
    help="Profile a model's layers (or the network) on this machine into the profile database.",
    invoke_without_command=True,
)


def _progress_bar(total: int, quiet: bool):
    """A Rich progress bar fed by the profiler's events; a no-op callback under --json."""
    if quiet:
        return None, (lambda _msg: None)
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), console=console(), transient=False)
    task = bar.add_task("profiling", total=total)
    started = []

    def on_event(msg: dict) -> None:
        if not started:  # started on the first event, so bad input fails before any bar is drawn
            bar.start()
            started.append(True)
        what = msg.get("event")
        if what == "layer":
            desc = f"tp {msg['tp']} mbs {msg['mbs']} layer {msg['layer']}"
        elif what == "update":
            desc = f"tp {msg['tp']} optimizer"
        else:
            desc = f"{what} {msg.get('bytes', 0) / 2**20:.2f} MiB"
        bar.update(task, advance=1, description=desc)

    return bar, on_event


def profile_cmd(
    spec: ProfileSpec,
    *,
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Profile MODEL's layers (forward, backward, activation memory, optimizer) for each mbs x TP."""
    if ctx.invoked_subcommand is not None:
        return

    if spec.model is None:
        raise InputError("--model is required (or use `sailor profile network`)")
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.catalog.models import get_model
    from sailor_core.profiler.compute import Hardware, num_steps, profile_model, save_profiles
    from sailor_core.profiler.stats import Repetitions

    model = get_model(spec.model)
    mbs_list, tp_list = list(spec.micro_batch_sizes), list(spec.tp_degrees)
    bar, on_event = _progress_bar(num_steps(model.name, mbs_list, tp_list), json_out)
    try:
        run = profile_model(model.name, micro_batch_sizes=mbs_list, tp_degrees=tp_list, seq_len=spec.seq_len,
                            hardware=Hardware(device=spec.device, gpu=spec.gpu, threads=spec.threads),
                            repeat=Repetitions(reps=spec.reps), timer=spec.timer,
                            measure_overhead=spec.measure_overhead, progress=on_event)
    finally:
        if bar:
            bar.stop()
    path = save_profiles(run.profiles) if spec.save else None
    out = run.to_dict()
    out["saved_to"] = str(path) if path else None
    if json_out:
        print_json(out)
        return
    _print_summary(run, path)


def _print_summary(run, path) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    c = console()
    table = Table(title=f"profile on {run.device_name} (torch {run.torch_version}, {run.threads} thread(s))")
    for col in ("tp", "mbs", "layer", "fwd ms", "bwd ms", "spread", "params", "act. KB", "out KB"):
        table.add_column(col, justify="right")
    for p, d in zip(run.profiles, run.details):
        f, b = ("fwd_cpu", "bwd_cpu") if d["timer"] == "cpu" else ("fwd", "bwd")
        for i, (lp, m) in enumerate(zip(p.layers, d["layers"])):
            spread = max(m[f]["spread"], m[b]["spread"])
            table.add_row(str(p.tp_degree), str(p.micro_batch_size), f"{i} {m['kind']}", f"{lp.fwd_s * 1e3:.3f}",
                          f"{lp.bwd_s * 1e3:.3f}", f"{spread:.0%}", f"{lp.params:,}",
                          f"{lp.activation_bytes / 1e3:,.1f}", f"{lp.output_bytes / 1e3:,.1f}")
    c.print(table)
    for tp_degree, p in {p.tp_degree: p for p in reversed(run.profiles)}.items():
        c.print(f"optimizer (AdamW), TP {tp_degree}: {p.update_s_per_param * 1e9:.2f} ns/param + "
                f"{p.update_fixed_s * 1e3:.3f} ms")
    if run.overhead_bytes is not None:
        c.print(f"constant memory per worker process: {run.overhead_bytes / 1e6:,.0f} MB")
    c.print(f"spread = (p90 - p10) / median of the repetitions; took {run.wall_s:.1f} s")
    if path:
        c.print(f"saved to {path}", soft_wrap=True)


CLOUD_MODES = {"auto": "auto", "embedded": "embedded", "local": "embedded", "real": "real"}


def network_cmd(
    spec: NetworkProfileSpec,
    *,
    cloud: Optional[str] = typer.Option(None, "--cloud", help="profile between cloud instances: auto (real clouds "
                                                              "when SAILOR_CLOUDS asks for them), embedded, real"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Measure p2p bandwidth vs message size and all-reduce among workers; fit the network model's curve.

    Without --cloud between processes of this machine; with --cloud between rented instances
    (the network-profile flow), which are always terminated at the end.
    """

    if cloud is not None:
        if cloud not in CLOUD_MODES:
            raise InputError(f"--cloud must be auto, embedded (or local) or real, got {cloud!r}; the zone says "
                             "which cloud (us-east-1a is AWS, us-central1-a GCP)")
        # lazy: loaded when the command runs (the CLI starts light)
        from sailor_core.profiler.network import network_link

        network_link(spec.gpu, spec.zone, spec.dst_zone, spec.workers)  # bad input fails before a Prefect server
        _network_cloud(spec, CLOUD_MODES[cloud], json_out)
        return
    if spec.gpu or spec.zone or spec.dst_zone:
        raise InputError("--gpu, --zone and --dst-zone are for cloud instances: add --cloud auto|embedded|real")
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.profiler.network import profile_network, save_network_profile, sizes_up_to

    sizes = sizes_up_to(spec.max_mib or 256)
    bar, on_event = _progress_bar(len(sizes) * 2, json_out)
    try:
        prof = profile_network(spec.workers, sizes=sizes, reps=spec.reps, device=spec.device or "cpu",
                               progress=on_event)
    finally:
        if bar:
            bar.stop()
    path = save_network_profile(prof) if spec.save is not False else None
    out = prof.to_json()
    out["saved_to"] = str(path) if path else None
    if json_out:
        print_json(out)
        return
    _print_network(prof, f"network: {spec.workers} local workers ({prof.src_zone}/{prof.src_gpu})")
    if path:
        console().print(f"saved to {path}", soft_wrap=True)


def _print_network(prof, title: str) -> None:
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.table import Table

    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.network.model import Endpoint, NetworkModel

    model = NetworkModel(inter_fits={(prof.src_zone, prof.src_gpu, 1, prof.dst_zone, prof.dst_gpu, 1): prof.fit})
    e = Endpoint(zone=prof.src_zone, gpu=prof.src_gpu)
    ar = dict(next(iter(prof.allreduce_points.values()), ()))
    n = next(iter(prof.allreduce_points), 2)
    table = Table(title=title)
    for col in ("bytes", "p2p ms", "p2p GB/s", "fit GB/s", f"all-reduce ({n}) ms", "ring model ms"):
        table.add_column(col, justify="right")
    for b, t in prof.p2p_points:
        row = [f"{b:,}", f"{t * 1e3:.3f}", f"{b / t / 1e9:.3f}", f"{prof.fit.bandwidth_bytes_per_s(b) / 1e9:.3f}"]
        if b in ar:
            row += [f"{ar[b] * 1e3:.3f}", f"{model.allreduce_time_s(b, [e] * n) * 1e3:.3f}"]
        table.add_row(*row)
    c = console()
    c.print(table)
    c.print(f"fit: bw(x) = {prof.fit.a:.4g} x^2 + {prof.fit.b:.4g} x + {prof.fit.c:.4g} GB/s, x = log2(bytes/1e6), "
            f"max {prof.fit.max_bw_bytes_per_s / 1e9:.3f} GB/s; largest error over the points "
            f"{prof.max_rel_error:.0%}")


def _network_cloud(spec: NetworkProfileSpec, cloud: str, json_out: bool) -> None:
    """Run the network-profile flow in this process (Prefect API chosen as `sailor train` does)."""
    # lazy: loaded when the command runs (the CLI starts light)
    from flows.cli.prefect_server import configure_prefect_env, would_start_server

    out = console()
    if not json_out and would_start_server():
        out.print("[dim]starting a local Prefect server (first time ~15-60 s)...[/dim]")
    choice = configure_prefect_env(start_server=True)
    if not json_out:
        out.print(f"[dim]{choice.describe()}[/dim]")
    # lazy: loaded when the command runs (the CLI starts light)
    from flows.cli.progress import quiet_engine_failures
    from flows.network_profile_flow import network_profile_flow
    from tasks import net_profiling

    stop_bar, on_event = _cloud_progress(json_out)
    net_profiling.add_progress_listener(on_event)
    try:
        with quiet_engine_failures():
            summary = network_profile_flow(**spec_parameters(spec), cloud=cloud)
    except KeyboardInterrupt:
        # Typer would turn it into a silent exit 130; the flow's `finally` has terminated the instances.
        stop_bar()
        sys.stderr.write("error: interrupted; the profile's instances were terminated (see `sailor jobs`)\n")
        raise typer.Exit(130) from None
    finally:
        net_profiling.remove_progress_listener(on_event)
        stop_bar()
    if json_out:
        print_json({k: v for k, v in summary.items() if k != "rows"})
        return
    # lazy: loaded when the command runs (the CLI starts light)
    from sailor_core.profiler.network import NetworkProfile

    prof = NetworkProfile.from_json(summary["profile"])
    where = "embedded cloud" if summary["mode"] == "embedded" else "cloud"
    _print_network(prof, f"network: {summary['num_workers']} x {summary['gpu']} instances "
                         f"({'/'.join(summary['instance_types'])}), {summary['src_zone']} -> {summary['dst_zone']}, "
                         f"{where}")
    out.print(f"job {summary['job_id']}: {len(summary['instances'])} instances, {summary['usd_spent']:.4f} USD, "
              f"{summary['instances_left_running']} left running")
    if summary["saved_to"]:
        out.print(f"saved to {summary['saved_to']}", soft_wrap=True)  # a path to copy: never wrapped
    elif summary["mode"] == "embedded":
        out.print("not saved: the embedded cloud's instances are this machine's processes (loopback), which must "
                  "not stand in for the zone's network; --save saves it anyway")
    else:
        out.print("not saved (--no-save)")


def _cloud_progress(quiet: bool):
    """A Rich bar fed by the network-profile flow's events (tasks.net_profiling listeners)."""
    if quiet:
        return (lambda: None), (lambda _msg: None)
    # lazy: loaded when the command runs (the CLI starts light)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), console=console(), transient=False)
    task = bar.add_task("network profile", total=None)
    started = []

    def stop() -> None:  # drawn only once something happened: bad input leaves no empty bar behind
        if started:
            bar.stop()

    def on_event(msg: dict) -> None:
        if not started:
            bar.start()
            started.append(True)
        what = msg.get("event")
        if what == "launching":
            bar.update(task, total=msg["total"], description=f"renting {msg['num_workers']} x {msg['gpu']} in "
                                                            f"{', '.join(msg['zones'])}")
        elif what == "launched":
            bar.update(task, description=f"{len(msg['instances'])} instances up; starting workers")
        elif what == "workers":
            bar.update(task, description="workers rendezvous")
        elif "done" in msg:
            desc = "measured" if what == "measured" else f"{what} {msg.get('bytes', 0) / 2**20:.2f} MiB"
            bar.update(task, completed=msg["done"], total=msg["total"], description=desc)

    return stop, on_event


profile_app.callback()(with_spec_options(ProfileSpec)(profile_cmd))
profile_app.command("network")(with_spec_options(NetworkProfileSpec)(network_cmd))


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
