"""Profile a model's layers for each (micro-batch size, TP degree) and store the result as profiles.

TP 1 runs in this process; TP > 1 runs the TP group on the devices at hand (one process per GPU,
or per CPU rank with gloo) via ``python -m sailor_core.profiler.tp_worker``, rank 0 reporting.
The intra-op thread count is set as the engine's ``launch_local`` sets it (1 per rank by
default): the profile must be taken under the threads the engine will run with.
"""

from __future__ import annotations

import datetime as _dt
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sailor_core.catalog.gpus import gpu_of_device_name, normalize_gpu_name
from sailor_core.catalog.models import get_model
from sailor_core.errors import InputError, ProfileError
from sailor_core.profiler.group import run_local_group
from sailor_core.profiler.overhead import idle_worker_rss_bytes
from sailor_core.profiles import ProfileDB, reset_default_profile_db
from sailor_core.profiles.store import read_profiles, user_profiles_dir
from sailor_core.profiler.stats import Repetitions
from sailor_core.profiles.types import LayerProfile, ModelProfile, ProfileKey

CPU_REGIME = "torch-fp32-adamw"          # the engine on CPU: fp32, AdamW
CUDA_REGIME = "torch-bf16-autocast-adamw"  # the engine on CUDA: bf16 autocast, AdamW

Progress = Callable[[dict], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRun:
    """What one ``profile_model`` call measured: the profiles plus the detail they drop (spread)."""

    profiles: tuple[ModelProfile, ...]
    details: tuple[dict, ...]   # per profile: per-layer timings with p10/p90, update points
    device_name: str
    torch_version: str
    threads: int
    wall_s: float
    overhead_bytes: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "device_name": self.device_name, "torch_version": self.torch_version, "threads": self.threads,
            "wall_s": self.wall_s, "overhead_bytes": self.overhead_bytes,
            "profiles": [dict(_profile_dict(p), detail=d) for p, d in zip(self.profiles, self.details)],
        }


def _profile_dict(p: ModelProfile) -> dict:
    return {
        "model": p.model, "gpu": p.gpu, "tp_degree": p.tp_degree, "micro_batch_size": p.micro_batch_size,
        "seq_len": p.seq_len, "regime": p.regime, "source": p.source,
        "update_s_per_param": p.update_s_per_param, "update_fixed_s": p.update_fixed_s,
        "layers": [{"fwd_s": lp.fwd_s, "bwd_s": lp.bwd_s, "params": lp.params,
                    "activation_bytes": lp.activation_bytes, "output_bytes": lp.output_bytes}
                   for lp in p.layers],
    }


# ---- device names -------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_type_of(cuda_device_name: str) -> str:
    """The catalog GPU type of a CUDA device name (``NVIDIA H200`` -> ``H200``); names in gpus.json."""
    gpu = gpu_of_device_name(cuda_device_name)
    if gpu is None:
        raise InputError(f"GPU {cuda_device_name!r} is not in the catalog; pass --gpu with its catalog name")
    return gpu


# ---- measuring ------------------------------------------------------------------------------

def run_measurements(model: str, micro_batch_sizes: list[int], *, device: str, seq_len: int | None = None,
                     tp_degree: int = 1, tp_rank: int = 0, tp_group=None, repeat: Repetitions = Repetitions(),
                     progress: Progress | None = None) -> dict:
    """Measure every layer index at every micro-batch size on this rank; JSON-able result."""
    import torch  # lazy: torch only where layers are measured; the CLI and flows import this module

    from sailor_core.profiler.measure import (  # lazy: torch
        TpRank,
        measure_chained,
        measure_layer,
        measure_model_update,
    )

    tp = TpRank(degree=tp_degree, rank=tp_rank, group=tp_group)
    warmups, reps = repeat.warmups, repeat.reps
    spec = get_model(model)
    dev = torch.device(device)
    seq = seq_len or spec.seq_len
    out: dict = {"by_mbs": {}, "update_points": []}
    for mbs in micro_batch_sizes:
        layers = []
        for i in range(spec.num_layer_indices):
            m = measure_layer(spec, i, micro_batch_size=mbs, seq_len=seq, device=dev, repeat=repeat, tp=tp)
            layers.append(m.to_dict())
            if progress:
                progress({"event": "layer", "tp": tp_degree, "mbs": mbs, "layer": i})
        if dev.type == "cuda" and tp_degree == 1:
            # The times the engine sees (see measure.py); the layers alone are kept beside them.
            chained = measure_chained(spec, micro_batch_size=mbs, seq_len=seq, device=dev, warmups=warmups,
                                      reps=reps)
            if chained is not None:
                for m, (f, b) in zip(layers, chained):
                    m["fwd_alone"], m["bwd_alone"] = m["fwd"], m["bwd"]
                    m["fwd"], m["bwd"] = f.to_dict(), b.to_dict()
            out.setdefault("timing_by_mbs", {})[str(mbs)] = "alone" if chained is None else "chained"
        out["by_mbs"][str(mbs)] = layers
    # the update line: every single layer (from the first mbs) plus the whole model in one optimizer
    first = out["by_mbs"][str(micro_batch_sizes[0])]
    out["update_points"] = [[m["params"], m["update"]["median_s"]] for m in first]
    n, t, c = measure_model_update(spec, device=dev, tp_degree=tp_degree, tp_rank=tp_rank, tp_group=tp_group)
    out["update_points"].append([n, t.median_s])
    if c is not None:
        out["update_points_cpu"] = [[m["params"], m["update_cpu"]["median_s"]] for m in first]
        out["update_points_cpu"].append([n, c.median_s])
    if progress:
        progress({"event": "update", "tp": tp_degree})
    return out


def fit_update_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(seconds per parameter, fixed seconds) of ``t = fixed + rate * n``, least squares in relative
    error (points span orders of magnitude), with the fixed part kept >= 0."""
    pts = [(float(n), float(t)) for n, t in points if n > 0 and t > 0]
    if not pts:
        raise ProfileError("no optimizer-update measurements to fit")
    # minimise sum ((fixed + rate n - t) / t)^2: normal equations of a weighted 2-parameter fit
    w = [1.0 / (t * t) for _, t in pts]
    s1 = sum(w)
    sn = sum(wi * n for wi, (n, _) in zip(w, pts))
    snn = sum(wi * n * n for wi, (n, _) in zip(w, pts))
    st = sum(wi * t for wi, (_, t) in zip(w, pts))
    snt = sum(wi * n * t for wi, (n, t) in zip(w, pts))
    det = s1 * snn - sn * sn
    if det > 0:
        fixed = (snn * st - sn * snt) / det
        rate = (s1 * snt - sn * st) / det
        if fixed >= 0 and rate > 0:
            return rate, fixed
    rate = snt / snn  # through the origin
    return rate, 0.0


def to_model_profile(key: ProfileKey, layers: list[dict], update_points: list, *, regime: str, source: str,
                     timer: str = "wall") -> ModelProfile:
    """The profile of ``key`` from ``run_measurements``' layers and update points.  ``timer`` "cpu"
    keeps the process CPU seconds (CPU devices at TP 1), "wall" the wall clock."""
    model, gpu, tp_degree, micro_batch_size, seq_len = key
    f, b = ("fwd_cpu", "bwd_cpu") if timer == "cpu" else ("fwd", "bwd")
    rate, fixed = fit_update_line([tuple(p) for p in update_points])
    return ModelProfile(
        model=get_model(model).name, gpu=gpu, tp_degree=tp_degree, micro_batch_size=micro_batch_size,
        seq_len=seq_len, regime=regime, source=source, update_s_per_param=rate, update_fixed_s=fixed,
        update_measured=True,
        layers=tuple(LayerProfile(fwd_s=m[f]["median_s"], bwd_s=m[b]["median_s"], params=m["params"],
                                  activation_bytes=m["activation_bytes"], output_bytes=m["output_bytes"],
                                  measured=True) for m in layers),
    )


def run_tp_group(model: str, micro_batch_sizes: list[int], *, tp_degree: int, device: str, threads: int,
                 seq_len: int | None = None, repeat: Repetitions = Repetitions(), timeout_s: float = 1800.0,
                 progress: Progress | None = None) -> dict:
    """Run the TP group as ``tp_degree`` local processes; rank 0's measurements."""
    args = ["--model", model, "--mbs", ",".join(map(str, micro_batch_sizes)), "--device", device,
            "--threads", str(threads), "--warmups", str(repeat.warmups), "--reps", str(repeat.reps)]
    if seq_len:
        args += ["--seq-len", str(seq_len)]
    result = run_local_group([sys.executable, "-m", "sailor_core.profiler.tp_worker", *args],
                             num_ranks=tp_degree, threads=threads, timeout_s=timeout_s, progress=progress,
                             what=f"TP-{tp_degree} profiling", workdir_prefix="sailor-profile-tp-")
    return result


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """Where a profile is measured: the device ("cpu" or "cuda"), the catalog GPU type to file a CUDA
    profile under (None: from the device's name) and the intra-op threads per rank."""

    device: str = "cpu"
    gpu: str | None = None
    threads: int = 1


def profile_model(model: str, *, micro_batch_sizes: list[int] = (1,), tp_degrees: list[int] = (1,),
                  seq_len: int | None = None, hardware: Hardware = Hardware(), repeat: Repetitions = Repetitions(),
                  timer: str = "wall", measure_overhead: bool = False,
                  progress: Progress | None = None) -> ProfileRun:
    """Profile ``model`` on this machine for every (micro-batch size, TP degree).

    ``timer``: "wall" keeps the median wall-clock time; "cpu" (CPU device, TP 1 only) the median
    process CPU time, i.e. the layer's own work without what other jobs on a shared machine take
    (a TP group's waits on its peers are not CPU time, so TP > 1 always keeps wall clock).
    """
    device, gpu, threads = hardware.device, hardware.gpu, hardware.threads
    spec = get_model(model)
    mbs_list = _positive_list(micro_batch_sizes, "micro-batch size")
    tps = _positive_list(tp_degrees, "TP degree")
    seq = seq_len or spec.seq_len
    if seq < 1 or seq > spec.max_position_embeddings:
        raise InputError(f"sequence length {seq} is outside 1..{spec.max_position_embeddings} for {spec.name}")
    if threads < 1:
        raise InputError(f"threads must be >= 1, got {threads}")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if timer not in ("wall", "cpu") or (timer == "cpu" and device != "cpu"):
        raise InputError(f"timer must be 'wall' or (on CPU) 'cpu', got {timer!r}")
    for t in tps:
        for what, n in (("attention heads", spec.num_heads), ("KV heads", spec.num_kv_heads),
                        ("FFN size", spec.ffn_size)):
            if n % t:
                raise InputError(f"TP degree {t} does not divide {spec.name}'s {n} {what}")
    import torch  # lazy: torch after the inputs are checked; the CLI and flows import this module

    if device == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA GPU is visible to torch on this machine")
        if max(tps) > torch.cuda.device_count():
            raise InputError(f"TP {max(tps)} needs {max(tps)} GPUs, this machine has {torch.cuda.device_count()}")
        dev_name = torch.cuda.get_device_name(0)
        gpu_type = gpu or gpu_type_of(dev_name)
        regime = CUDA_REGIME
    else:
        dev_name = cpu_name()
        gpu_type = gpu or "cpu"
        regime = CPU_REGIME
    gpu_type = normalize_gpu_name(gpu_type)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    source = (f"sailor-profiler: {dev_name}; torch {torch.__version__}; {date}; "
              f"{threads} thread(s) per rank" if device == "cpu" else
              f"sailor-profiler: {dev_name}; torch {torch.__version__}; {date}")
    t0 = time.monotonic()
    profiles, details = [], []
    for tp in tps:
        if tp == 1:
            old = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                res = run_measurements(spec.name, mbs_list, device=device, seq_len=seq, repeat=repeat,
                                       progress=progress)
            finally:
                torch.set_num_threads(old)
        else:
            res = run_tp_group(spec.name, mbs_list, tp_degree=tp, device=device, threads=threads, seq_len=seq,
                               repeat=repeat, progress=progress)
        used = timer if tp == 1 else "wall"
        points = res["update_points_cpu"] if used == "cpu" else res["update_points"]
        for mbs in mbs_list:
            layers = res["by_mbs"][str(mbs)]
            profiles.append(to_model_profile((spec.name, gpu_type, tp, mbs, seq), layers, points, regime=regime,
                                             source=f"{source}; {used} clock", timer=used))
            details.append({"layers": layers, "update_points": points, "timer": used})
    overhead = None
    if measure_overhead:
        overhead = idle_worker_rss_bytes(device=device, threads=threads)
    return ProfileRun(profiles=tuple(profiles), details=tuple(details), device_name=dev_name,
                      torch_version=torch.__version__, threads=threads, wall_s=time.monotonic() - t0,
                      overhead_bytes=overhead)


def _positive_list(values, what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{what} must be a positive integer, got {v!r}")
        if v not in out:
            out.append(v)
    if not out:
        raise InputError(f"give at least one {what}")
    return out


def num_steps(model: str, micro_batch_sizes, tp_degrees) -> int:
    """Progress units of a ``profile_model`` call: one per (TP, mbs, layer) plus one update per TP."""
    n = get_model(model).num_layer_indices
    return len(list(tp_degrees)) * (len(list(micro_batch_sizes)) * n + 1)


def save_profiles(profiles, directory: str | Path | None = None) -> Path:
    """Add profiles to the user's profile folder (``<dir>/profiled-<model>-<gpu>.parquet``), replacing
    equal keys, and make the default database see them."""
    profiles = list(profiles)
    if not profiles:
        raise ProfileError("nothing to save")
    directory = Path(directory) if directory is not None else user_profiles_dir()
    written = None
    for model, gpu in sorted({(p.model, p.gpu) for p in profiles}):
        path = directory / f"profiled-{model}-{gpu}.parquet"
        db = ProfileDB(read_profiles(path) if path.exists() else ())
        db.extend(p for p in profiles if (p.model, p.gpu) == (model, gpu))
        written = db.save(path)
    reset_default_profile_db()
    return written
