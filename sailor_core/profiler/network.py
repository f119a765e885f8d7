"""Network profiler: p2p bandwidth vs message size between two workers and all-reduce among N.

The measurement runs in the workers themselves (torch.distributed, gloo on CPU, nccl on GPUs),
so it sees the same transport the engine uses:

* p2p: ping-pong between ranks 0 and 1 (send, the peer receives and sends back); one-way time =
  round trip / 2, median over repetitions, message sizes 64 KiB .. 256 MiB.
* all-reduce: ``dist.all_reduce`` of a float32 buffer among all N ranks, timed on rank 0 between
  barriers, median over repetitions.

The p2p points are fitted to the network model's curve format (``sailor_core.network.fits``:
``bw(x) = a x^2 + b x + c`` GB/s with ``x = log2(bytes / 1e6)``, capped at ``max_bw``), in
relative error; the largest relative error of the fit over the measured points is stated with
it.  Beyond the largest measured message the curve is held at the last measured bandwidth
(the fit is anchored there), as a link's bandwidth plateaus for large messages.

Locally: ``profile_network(num_workers)`` starts N processes on this machine.  In a cloud the
network-profile flow (flows/network_profile_flow.py) rents the instances and has each one's
agent start ``python -m sailor_core.profiler.net_worker`` with env:// rendezvous
(MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE); rank 0's points come back through its agent's status
document, and ``network_profile_from_points`` turns them into a profile for (src zone/GPU, dst
zone/GPU).
Profiles are saved as JSON where ``sailor_core.network.default_network`` reads them.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sailor_core.catalog import get_gpu, normalize_gpu_name
from sailor_core.errors import InputError, ProfileError
from sailor_core.network._data import user_network_dir
from sailor_core.network.fits import MAX_FIT_BYTES, MIN_FIT_BYTES, BandwidthFit
from sailor_core.network.model import default_network
from sailor_core.profiler.compute import cpu_name, gpu_type_of
from sailor_core.profiler.group import run_local_group
from sailor_core.zones import parse_zone

DEFAULT_SIZES = tuple(2**k for k in range(16, 29, 2))  # 64 KiB .. 256 MiB
NETWORK_FORMAT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkProfile:
    src_zone: str
    src_gpu: str
    dst_zone: str
    dst_gpu: str
    fit: BandwidthFit
    max_rel_error: float  # of the fit's time over the measured p2p points
    p2p_points: tuple[tuple[int, float], ...]  # (bytes, one-way seconds)
    allreduce_points: dict = field(default_factory=dict)  # N -> ((bytes, seconds), ...)
    # N -> ((bytes, CPU seconds of one rank), ...): on CPU the collective's own work, which a
    # machine shared with other jobs does not inflate (waiting for the peer is not CPU time)
    allreduce_cpu_points: dict = field(default_factory=dict)
    source: str = ""

    def allreduce_time_s(self, num_bytes: float, num_ranks: int) -> float | None:
        """Measured all-reduce time among ``num_ranks``, interpolated log-log between the measured
        sizes (clamped to the ends); None when that group size was not measured."""
        return _interpolate(sorted(self.allreduce_points.get(num_ranks, ())), num_bytes)

    def allreduce_cpu_s(self, num_bytes: float, num_ranks: int) -> float | None:
        """CPU seconds one rank spends in that all-reduce (CPU workers), interpolated likewise."""
        return _interpolate(sorted(self.allreduce_cpu_points.get(num_ranks, ())), num_bytes)

    def to_json(self) -> dict:
        fit = [[self.fit.a, self.fit.b, self.fit.c], self.fit.max_bw_bytes_per_s]
        return {
            "sailor_network_format": NETWORK_FORMAT,
            "source": self.source,
            # the nested layout of Sailor's multizone_bandwidths_het.json, one GPU per side
            "fits": {self.src_zone: {self.src_gpu: {"1": {self.dst_zone: {self.dst_gpu: {"1": fit}}}}}},
            "max_rel_error": self.max_rel_error,
            "p2p_points": [list(p) for p in self.p2p_points],
            "allreduce_points": {str(n): [list(p) for p in pts] for n, pts in self.allreduce_points.items()},
            "allreduce_cpu_points": {str(n): [list(p) for p in pts] for n, pts in self.allreduce_cpu_points.items()},
        }


    @classmethod
    def from_json(cls, data: dict) -> NetworkProfile:
        """The inverse of ``to_json`` (one link per document)."""
        try:
            (src_zone, by_gpu), = data["fits"].items()
            (src_gpu, by_count), = by_gpu.items()
            (dst_zone, by_dst_gpu), = by_count["1"].items()
            (dst_gpu, entry), = by_dst_gpu.items()
            fit = BandwidthFit.from_json(entry["1"])

            def points(tree: dict) -> dict:
                return {int(n): tuple((int(b), float(t)) for b, t in pts) for n, pts in tree.items()}

            return cls(src_zone=src_zone, src_gpu=src_gpu, dst_zone=dst_zone, dst_gpu=dst_gpu, fit=fit,
                       max_rel_error=float(data["max_rel_error"]),
                       p2p_points=tuple((int(b), float(t)) for b, t in data["p2p_points"]),
                       allreduce_points=points(data.get("allreduce_points", {})),
                       allreduce_cpu_points=points(data.get("allreduce_cpu_points", {})),
                       source=str(data.get("source", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"not a network profile of one link: {exc}") from None


def _interpolate(pts, num_bytes: float) -> float | None:
    """Log-log interpolation of sorted (bytes, seconds) points: the smallest size's time below it
    (latency-bound), proportional to size beyond the largest (bandwidth-bound); None without points."""
    if not pts:
        return None
    if num_bytes <= 0:
        return 0.0
    if num_bytes <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if num_bytes <= b1:
            f = math.log(num_bytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    b_last, t_last = pts[-1]
    return t_last * num_bytes / b_last


# ---- inside the workers --------------------------------------------------------------------

def _reps_for(size: int, reps: int) -> int:
    """More repetitions for small messages: they are cheap and the noisiest (scheduler latency)."""
    return max(reps, min(40, int(32e6 // size)))


def _sync(device) -> None:
    if device.type == "cuda":
        import torch  # lazy: torch only inside a measuring worker; the flows and the CLI import this module

        torch.cuda.synchronize()


def measure_in_group(sizes=DEFAULT_SIZES, *, reps: int = 5, allreduce: bool = True, progress=None) -> dict | None:
    """Run the measurements in an initialised process group; rank 0 returns the points."""
    import torch  # lazy: torch only inside a measuring worker; the flows and the CLI import this module
    import torch.distributed as dist  # lazy: as torch

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    p2p, ar, ar_cpu = [], [], []
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        times = []
        dist.barrier()
        n = _reps_for(size, reps)
        for i in range(n + 1):  # the first exchange sets the connection up: a warm-up
            if rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
                _sync(device)
                if i:
                    times.append((time.perf_counter() - t0) / 2)
            elif rank == 1:
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
        dist.barrier()
        if rank == 0:
            p2p.append((size, sorted(times)[len(times) // 2]))
            if progress:
                progress({"event": "p2p", "bytes": size})
        if allreduce and world >= 2:
            times, cpu = [], []
            for i in range(n + 1):
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                dist.all_reduce(buf)
                _sync(device)
                if i:
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
            if rank == 0:
                ar.append((size, sorted(times)[len(times) // 2]))
                ar_cpu.append((size, sorted(cpu)[len(cpu) // 2]))
                if progress:
                    progress({"event": "allreduce", "bytes": size})
        del buf
    if rank != 0:
        return None
    out = {"world_size": world, "p2p": p2p, "allreduce": ar}
    if device.type == "cpu":
        out["allreduce_cpu"] = ar_cpu
    return out


# ---- fitting ---------------------------------------------------------------------------------

def _x(num_bytes: float) -> float:
    return math.log2(num_bytes / 1e6)


def fit_bandwidth(points) -> tuple[BandwidthFit, float]:
    """Fit (bytes, seconds) points to the network model's curve; (fit, largest relative time error)."""
    import numpy as np  # lazy: numpy (~0.15 s) only when fitting; importing this module stays light

    pts = sorted((int(b), float(t)) for b, t in points if b > 0 and t > 0)
    if len(pts) < 3:
        raise ProfileError(f"need at least 3 message sizes to fit a bandwidth curve, got {len(pts)}")
    xs = np.array([_x(b) for b, _ in pts])
    bws = np.array([b / t / 1e9 for b, t in pts])  # GB/s
    # Hold the last measured bandwidth out to the fit's upper end (1 GiB) so the quadratic does
    # not bend down where nothing was measured.
    anchor_x = [x for x in np.linspace(xs[-1], _x(MAX_FIT_BYTES), 4)[1:] if x > xs[-1] + 1e-9]
    fx = np.concatenate([xs, anchor_x])
    fy = np.concatenate([bws, [bws[-1]] * len(anchor_x)])
    a, b, c = np.polyfit(fx, fy, 2, w=1.0 / fy)  # weights 1/bw: relative residuals
    fit = BandwidthFit(a=float(a), b=float(b), c=float(c), max_bw_bytes_per_s=float(bws.max() * 1e9))
    err = max(abs(nb / fit.bandwidth_bytes_per_s(nb) - t) / t for nb, t in pts if nb >= MIN_FIT_BYTES)
    return fit, float(err)


def network_profile_from_points(result: dict, *, src_zone: str = "local", src_gpu: str = "cpu",
                                dst_zone: str | None = None, dst_gpu: str | None = None,
                                source: str = "") -> NetworkProfile:
    """A profile of the link from ``measure_in_group``'s points (rank 0's answer)."""
    parse_zone(src_zone)
    parse_zone(dst_zone or src_zone)
    fit, err = fit_bandwidth(result["p2p"])
    n = int(result["world_size"])
    ar = {n: tuple((int(b), float(t)) for b, t in result.get("allreduce", ()))}
    ar_cpu = {n: tuple((int(b), float(t)) for b, t in result.get("allreduce_cpu", ()))}
    return NetworkProfile(src_zone=src_zone, src_gpu=normalize_gpu_name(src_gpu), dst_zone=dst_zone or src_zone,
                          dst_gpu=normalize_gpu_name(dst_gpu or src_gpu), fit=fit, max_rel_error=err,
                          p2p_points=tuple((int(b), float(t)) for b, t in result["p2p"]),
                          allreduce_points=ar if ar[n] else {}, allreduce_cpu_points=ar_cpu if ar_cpu[n] else {},
                          source=source)


NET_WORKER_MODULE = "sailor_core.profiler.net_worker"


def sizes_up_to(max_mib: int) -> list[int]:
    """Message sizes 64 KiB x 4^k up to ``max_mib`` MiB (at least three: a curve needs them)."""
    if isinstance(max_mib, bool) or not isinstance(max_mib, int) or max_mib < 1:
        raise InputError(f"--max-mib must be an integer >= 1, got {max_mib!r}")
    sizes = [2**k for k in range(16, 41, 2) if 2**k <= max_mib * 2**20]
    return sizes if len(sizes) >= 3 else [2**16, 2**18, 2**20]


def network_worker_args(*, sizes=DEFAULT_SIZES, reps: int = 5, device: str = "cpu") -> list[str]:
    """The worker's arguments after ``python -m sailor_core.profiler.net_worker``."""
    return ["--sizes", ",".join(map(str, sizes)), "--reps", str(reps), "--device", device]


def network_worker_command(*, out_path: str | None = None, sizes=DEFAULT_SIZES, reps: int = 5,
                           device: str = "cpu", python: str = sys.executable) -> list[str]:
    """The command each worker runs (rendezvous from the environment: MASTER_ADDR, MASTER_PORT,
    RANK, WORLD_SIZE); rank 0 writes the points to ``out_path``, which
    ``network_profile_from_points(json.load(...), src_zone=..., src_gpu=..., dst_zone=..., dst_gpu=...)``
    fits and ``save_network_profile`` stores.  On cloud instances the orchestration has each
    instance's agent run the same module with these arguments (tasks/net_profiling.py)."""
    cmd = [python, "-m", NET_WORKER_MODULE, *network_worker_args(sizes=sizes, reps=reps, device=device)]
    return cmd + (["--out", out_path] if out_path else [])


# ---- a link between cloud instances (the network-profile flow rents them) --------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkLink:
    """What to measure between cloud instances: ``num_workers`` instances of ``gpu``, rank 0 in
    ``src_zone`` and rank 1 in ``dst_zone`` (the p2p pair); further ranks alternate between the
    two zones (the all-reduce among all of them)."""

    gpu: str
    src_zone: str
    dst_zone: str
    num_workers: int

    def zones_by_rank(self) -> list[str]:
        return [self.src_zone if rank % 2 == 0 else self.dst_zone for rank in range(self.num_workers)]

    @property
    def clouds(self) -> tuple[str, ...]:
        return tuple(sorted({parse_zone(z).cloud for z in (self.src_zone, self.dst_zone)}))


def network_link(gpu: str | None, zone: str | None, dst_zone: str | None = None, num_workers: int = 2) -> NetworkLink:
    """Checked input: a catalog GPU, known zones (``dst_zone`` defaults to ``zone``), two workers or more."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 2:
        raise InputError(f"--workers must be an integer >= 2 (p2p needs two instances), got {num_workers!r}")
    if not gpu:
        raise InputError("--gpu is required to profile cloud instances (e.g. --gpu T4)")
    if not zone:
        raise InputError("--zone is required to profile cloud instances (e.g. --zone us-central1-a)")
    zones = [parse_zone(zone)] + ([parse_zone(dst_zone)] if dst_zone else [])
    if any(z.cloud == "local" for z in zones):
        raise InputError("zone 'local' is this machine's processes, not a cloud's: drop --cloud to profile them")
    src, dst = zones[0].name, zones[-1].name
    return NetworkLink(gpu=get_gpu(normalize_gpu_name(gpu)).name, src_zone=src, dst_zone=dst,
                       num_workers=num_workers)


# ---- running it locally ---------------------------------------------------------------------

def profile_network(num_workers: int = 2, *, sizes=DEFAULT_SIZES, reps: int = 5, device: str = "cpu",
                    threads: int = 1, timeout_s: float = 600.0, progress=None) -> NetworkProfile:
    """Measure between ``num_workers`` local processes (gloo on CPU) and fit the p2p curve."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 2:
        raise InputError(f"--workers must be an integer >= 2 (p2p needs two), got {num_workers!r}")
    sizes = sorted(int(s) for s in sizes)
    if len(sizes) < 3 or sizes[0] < 4:
        raise InputError("give at least 3 message sizes of 4 bytes or more")
    if device not in ("cpu", "cuda"):
        raise InputError(f"device must be 'cpu' or 'cuda', got {device!r}")
    argv = network_worker_command(sizes=sizes, reps=reps, device=device) + ["--threads", str(threads)]
    result = run_local_group(argv, num_ranks=num_workers, threads=threads, timeout_s=timeout_s,
                             progress=progress, what="network profiling", all_ranks_must_succeed=False,
                             workdir_prefix="sailor-profile-net-")
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    import torch  # lazy: torch (~2 s) for its version and device name only; the flows import this module

    backend = "nccl" if device == "cuda" else "gloo"
    source = (f"sailor-profiler network: {num_workers} local processes, {backend}, {cpu_name()}; "
              f"torch {torch.__version__}; {date}")
    gpu = "cpu"
    if device == "cuda":
        gpu = gpu_type_of(torch.cuda.get_device_name(0))
    return network_profile_from_points(result, src_zone="local", src_gpu=gpu, source=source)


def save_network_profile(profile: NetworkProfile, directory: str | Path | None = None) -> Path:
    """Write ``<dir>/<src_zone>-<src_gpu>--<dst_zone>-<dst_gpu>.json`` (default: the user's network
    folder, which ``default_network`` reads) and make the default network see it."""
    directory = Path(directory) if directory is not None else user_network_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{profile.src_zone}-{profile.src_gpu}--{profile.dst_zone}-{profile.dst_gpu}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(profile.to_json(), indent=2))
    os.replace(tmp, path)
    default_network.cache_clear()
    return path
