"""``sailor profile`` (a model's layers on this machine) and ``sailor profile network``.

Both write into the user's folders ($SAILOR_HOME or ~/.sailor: ``profiles/``, ``network/``),
which the profile database and the network model read.  torch is imported inside the commands.
"""

from __future__ import annotations

from typing import Optional

import typer

from flows.cli_common import console, print_json

profile_app = typer.Typer(
    name="profile",
    help="Profile a model's layers (or the network) on this machine into the profile database.",
    invoke_without_command=True,
)


def _int_list(text: str, what: str) -> list[int]:
    from sailor_core.errors import InputError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{what} must be comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise InputError(f"{what} must be comma-separated positive integers, got {text!r}")
    return values


def _progress_bar(total: int, quiet: bool):
    """A Rich progress bar fed by the profiler's events; a no-op callback under --json."""
    if quiet:
        return None, (lambda _msg: None)
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


@profile_app.callback()
def profile_cmd(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", help="catalog model name (e.g. tiny, small, opt-350m)"),
    mbs: str = typer.Option("1", "--mbs", help="micro-batch sizes, comma-separated (e.g. 1,2,4)"),
    tp: str = typer.Option("1", "--tp", help="TP degrees, comma-separated (e.g. 1,2)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="catalog GPU type to file a CUDA profile under "
                                                        "(default: from the device name)"),
    threads: int = typer.Option(1, "--threads", help="intra-op threads per rank (the engine's default is 1)"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="tokens per sequence (default: the model's)"),
    reps: int = typer.Option(10, "--reps", help="timed repetitions per layer (after 2 warm-ups)"),
    timer: str = typer.Option("wall", "--timer", help="wall, or cpu: process CPU time (CPU, TP 1; robust on "
                                                      "a machine shared with other jobs)"),
    overhead: bool = typer.Option(True, "--overhead/--no-overhead",
                                  help="also measure the framework's constant memory per process"),
    save: bool = typer.Option(True, "--save/--no-save", help="write the profiles to your profiles folder"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Profile MODEL's layers (forward, backward, activation memory, optimizer) for each mbs x TP."""
    if ctx.invoked_subcommand is not None:
        return
    from sailor_core.errors import InputError

    if model is None:
        raise InputError("--model is required (or use `sailor profile network`)")
    if reps < 1:
        raise InputError(f"--reps must be >= 1, got {reps}")
    from sailor_core.catalog.models import get_model
    from sailor_core.profiler.compute import num_steps, profile_model, save_profiles

    spec = get_model(model)
    mbs_list, tp_list = _int_list(mbs, "--mbs"), _int_list(tp, "--tp")
    bar, on_event = _progress_bar(num_steps(spec.name, mbs_list, tp_list), json_out)
    try:
        run = profile_model(spec.name, micro_batch_sizes=mbs_list, tp_degrees=tp_list, device=device, gpu=gpu,
                            threads=threads, seq_len=seq_len, reps=reps, timer=timer, measure_overhead=overhead,
                            progress=on_event)
    finally:
        if bar:
            bar.stop()
    path = save_profiles(run.profiles) if save else None
    out = run.to_dict()
    out["saved_to"] = str(path) if path else None
    if json_out:
        print_json(out)
        return
    _print_summary(run, path)


def _print_summary(run, path) -> None:
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
        c.print(f"saved to {path}")


@profile_app.command("network")
def network_cmd(
    workers: int = typer.Option(2, "--workers", help="local worker processes (p2p uses two, all-reduce all)"),
    reps: int = typer.Option(5, "--reps", help="repetitions per message size (more for small ones)"),
    max_mib: int = typer.Option(256, "--max-mib", help="largest message in MiB (sizes 64 KiB x 4^k)"),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) or cuda (nccl)"),
    save: bool = typer.Option(True, "--save/--no-save", help="write the fit to your network folder"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Measure p2p bandwidth vs message size and all-reduce among local workers; fit the curve."""
    from sailor_core.errors import InputError
    from sailor_core.profiler.network import profile_network, save_network_profile

    if reps < 1:
        raise InputError(f"--reps must be >= 1, got {reps}")
    if max_mib < 1:
        raise InputError(f"--max-mib must be >= 1, got {max_mib}")
    sizes = [2**k for k in range(16, 41, 2) if 2**k <= max_mib * 2**20]
    if len(sizes) < 3:
        sizes = [2**16, 2**18, 2**20]
    bar, on_event = _progress_bar(len(sizes) * 2, json_out)
    try:
        prof = profile_network(workers, sizes=sizes, reps=reps, device=device, progress=on_event)
    finally:
        if bar:
            bar.stop()
    path = save_network_profile(prof) if save else None
    out = prof.to_json()
    out["saved_to"] = str(path) if path else None
    if json_out:
        print_json(out)
        return
    from rich.table import Table

    from sailor_core.network.model import Endpoint, NetworkModel

    model = NetworkModel(inter_fits={(prof.src_zone, prof.src_gpu, 1, prof.dst_zone, prof.dst_gpu, 1): prof.fit})
    e = Endpoint(zone=prof.src_zone, gpu=prof.src_gpu)
    ar = dict(next(iter(prof.allreduce_points.values()), ()))
    n = next(iter(prof.allreduce_points), workers)
    table = Table(title=f"network: {workers} local workers ({prof.src_zone}/{prof.src_gpu})")
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
    if path:
        c.print(f"saved to {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
