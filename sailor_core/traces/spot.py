"""Loaders for the measured spot traces in ``data/spot_traces`` (formats A-D of its README).

Every loader returns an :class:`AvailabilityTrace` counting GPUs (all of these
instances hold one GPU, except the 8-GPU VMs of format D, counted as 8).
GPU types the catalog lacks are mapped to the nearest catalog GPU, see
``SPOT_GPU_MAP``; the trace's ``notes`` say which mapping was applied.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sailor_core.catalog import normalize_gpu_name
from sailor_core.errors import InputError, UnknownNameError
from sailor_core.traces.model import AvailabilityTrace, GpuZone, PreemptionEvent, build_trace
from sailor_core.traces.sailor_csv import _read_text
from sailor_core.zones import parse_zone

# K80 and P100 are not in the GPU catalog.  P100 -> V100-16: same 16 GB of HBM2
# and the closest compute (9.3 vs 15.7 fp32 TFLOP/s).  K80 (12 GB GDDR5 per die,
# ~4 fp32 TFLOP/s, 240 GB/s) -> T4 (16 GB, 8 TFLOP/s, 320 GB/s), the smallest,
# cheapest catalog GPU.  Replays on these traces therefore see faster GPUs than
# the measured ones; the *availability* (counts, preemption times) is unchanged.
SPOT_GPU_MAP: dict[str, str] = {
    "k80": "T4",
    "p100": "V100-16",
    "v100": "V100-16",
    "a100": "A100-40",
    "t4": "T4",
}
# EC2 families of the traces: GPU per instance (all sizes used here hold 1 GPU,
# except p2.8xlarge / p3.16xlarge in format D, whose GPU count the log gives).
_EC2_FAMILY_GPU = {"g4dn": "t4", "p2": "k80", "p3": "v100"}
# The zone of Bamboo's event traces was not recorded; they are placed here.
UNKNOWN_AWS_ZONE = "us-east-1a"


def map_spot_gpu(name: str, gpu_map: dict[str, str] | None = None) -> tuple[str, str | None]:
    """(catalog GPU, note or None) for a trace's GPU spelling such as ``nvidia-tesla-k80``."""
    table = {**SPOT_GPU_MAP, **{k.lower(): v for k, v in (gpu_map or {}).items()}}
    short = name.lower().removeprefix("nvidia-tesla-").removeprefix("nvidia-")
    if short in table:
        target = normalize_gpu_name(table[short])
        try:
            same = normalize_gpu_name(short) == target
        except UnknownNameError:
            same = False
        return target, None if same else f"{short.upper()} mapped to {target}"
    return normalize_gpu_name(name), None


def _lines(path: str | Path) -> list[str]:
    # The Bamboo CSVs have CRLF line endings.
    return [ln.strip() for ln in _read_text(path).replace("\r", "").split("\n") if ln.strip()]


def _notes(*items: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i for i in items if i))


# ---------------------------------------------------------------- format A
_A_NAME = re.compile(r"aws-spot-instances-(?P<family>[a-z0-9]+)-(?P<size>[a-z0-9]+)-(?:(?P<zone>[a-z]{2}-[a-z]+-\d[a-z])-)?")


def load_count_steps(
    path: str | Path,
    *,
    gpu: str | None = None,
    zone: str | None = None,
    time_unit: str = "auto",
    gpu_map: dict[str, str] | None = None,
) -> AvailabilityTrace:
    """Format A: ``time,active_count`` rows written in (before, after) pairs at each change.

    ``time_unit`` is ``s``, ``h`` or ``auto`` (hours when any time has a decimal
    point: only the 3.7-day p2 file, converted to hours with 3 decimals).
    Every drop in the raw sequence is a preemption, including the six drops that
    recover within one 3.6 s tick of the hours file (invisible in the counts).
    """
    lines = _lines(path)
    name = Path(path).name
    gpu, zone, notes = _gpu_zone_from_a_name(name, gpu, zone, gpu_map, source=str(path))
    raw: list[tuple[str, int]] = []
    for n, ln in enumerate(lines, 1):
        parts = ln.split(",")
        if len(parts) != 2:
            raise InputError(f"{path}: line {n}: expected 'time,count', got {ln!r}")
        try:
            raw.append((parts[0].strip(), int(parts[1])))
            float(parts[0])
        except ValueError:
            raise InputError(f"{path}: line {n}: expected numbers, got {ln!r}") from None
    if not raw:
        raise InputError(f"{path}: empty trace")
    if time_unit == "auto":
        time_unit = "h" if any("." in t for t, _ in raw) else "s"
    if time_unit not in ("s", "h"):
        raise InputError(f"time_unit must be 's', 'h' or 'auto', got {time_unit!r}")
    scale = 3600.0 if time_unit == "h" else 1.0
    key = (gpu, zone)
    samples: list[tuple[float, dict[GpuZone, int]]] = []
    drops: dict[float, int] = defaultdict(int)
    prev: int | None = None
    for t_text, count in raw:
        t = float(t_text) * scale
        if count < 0:
            raise InputError(f"{path}: negative count {count}")
        if samples and t < samples[-1][0]:
            raise InputError(f"{path}: time goes back at {t_text}")
        if prev is not None and count < prev:
            drops[t] += prev - count
        prev = count
        samples.append((t, {key: count}))
    events = [PreemptionEvent(time_s=t, gpu=gpu, zone=zone, num_gpus=k) for t, k in drops.items()]
    return build_trace(
        samples,
        keys=(key,),
        preemptions=events,
        derive_preemptions=False,
        end_s=samples[-1][0],
        source=str(path),
        notes=_notes(*notes, f"time unit: {'hours' if time_unit == 'h' else 'seconds'}"),
    )


def _gpu_zone_from_a_name(name, gpu, zone, gpu_map, *, source):
    notes: list[str | None] = []
    m = _A_NAME.search(name)
    if gpu is None:
        if not m or m["family"] not in _EC2_FAMILY_GPU:
            raise InputError(f"{source}: cannot tell the GPU type from the file name; pass the GPU type")
        gpu, note = map_spot_gpu(_EC2_FAMILY_GPU[m["family"]], gpu_map)
        notes.append(note)
    else:
        gpu = normalize_gpu_name(gpu)
    if zone is None:
        if m and m["zone"]:
            zone = m["zone"]
        elif m and m["family"] == "p2":
            # Bamboo commit 947038d: "Added graph for p2.xlarge on us-east-1d".
            zone = "us-east-1d"
            notes.append("zone us-east-1d from Bamboo commit 947038d")
        else:
            raise InputError(f"{source}: cannot tell the zone from the file name; pass the zone")
    return gpu, parse_zone(zone).name, notes


# ---------------------------------------------------------------- format B
def load_node_events(
    path: str | Path,
    *,
    gpu: str | None = None,
    zone: str | None = None,
    keep_synthetic_swaps: bool = False,
    gpu_map: dict[str, str] | None = None,
) -> AvailabilityTrace:
    """Format B: ``time_ms,add|remove,nodeN``; the pool starts empty at t=0.

    Removes sharing a timestamp are one bulk preemption.  A timestamp with both
    adds and removes is one of Oobleck's synthetic swaps (no measured trace has
    one): by default its matched add/remove pairs are not counted as preemptions,
    since the rescaled count did not change there.
    """
    lines = _lines(path)
    stem = Path(path).name.lower()
    gpu, zone, notes = _node_events_pool(path, stem, gpu, zone, gpu_map)
    key = (gpu, zone)
    by_time, order = _adds_and_removes(path, lines)
    samples: list[tuple[float, dict[GpuZone, int]]] = [(0.0, {key: 0})]
    events: list[PreemptionEvent] = []
    count = 0
    num_swaps = 0
    for t in order:
        adds, removes = by_time[t]
        count += adds - removes
        lost = removes
        if adds and removes:
            num_swaps += min(adds, removes)
            if not keep_synthetic_swaps:
                lost = removes - min(adds, removes)
        if lost:
            events.append(PreemptionEvent(time_s=t, gpu=gpu, zone=zone, num_gpus=lost))
        samples.append((t, {key: count}))
    if num_swaps:
        notes.append(f"{num_swaps} add+remove swaps {'kept as preemptions' if keep_synthetic_swaps else 'not counted as preemptions'}")
    return build_trace(
        samples, keys=(key,), preemptions=events, derive_preemptions=False,
        end_s=order[-1], source=str(path), notes=_notes(*notes),
    )


def _node_events_pool(path, stem: str, gpu: str | None, zone: str | None,
                      gpu_map: dict[str, str] | None) -> tuple[str, str, list[str | None]]:
    """The (GPU type, zone) a format-B file describes, from its name unless given, with notes."""
    notes: list[str | None] = []
    if gpu is None:
        if "p3" in stem:
            gpu, note = map_spot_gpu("v100", gpu_map)
            notes.append("p3 family -> V100-16 (p3.2xlarge, 1 GPU per node, per Parcae)")
        elif "g4dn" in stem or "scale_gcp" in stem:
            # scale_gcp-trace.csv is Bamboo's g4dn trace rescaled (spot_traces README, section 3).
            gpu, note = map_spot_gpu("t4", gpu_map)
            notes.append("g4dn family -> T4 (g4dn.xlarge, 1 GPU per node)")
        else:
            raise InputError(f"{path}: cannot tell the GPU type from the file name; pass the GPU type")
    else:
        gpu = normalize_gpu_name(gpu)
    if zone is None:
        zone = UNKNOWN_AWS_ZONE
        notes.append(f"zone not recorded; placed in {UNKNOWN_AWS_ZONE}")
    if "scale_" in stem:
        notes.append("Oobleck's rescaled copy (15 + floor((c - c_min) * 15 / range)), not an independent measurement")
    return gpu, parse_zone(zone).name, notes


def _adds_and_removes(path, lines: list[str]) -> tuple[dict[float, list[int]], list[float]]:
    """{time: [adds, removes]} and the times in order; InputError naming the line of a bad one."""
    by_time: dict[float, list[int]] = {}
    order: list[float] = []
    alive: set[str] = set()
    for n, ln in enumerate(lines, 1):
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) != 3 or parts[1] not in ("add", "remove"):
            raise InputError(f"{path}: line {n}: expected 'time_ms,add|remove,node', got {ln!r}")
        try:
            t = float(parts[0]) / 1000.0
        except ValueError:
            raise InputError(f"{path}: line {n}: time {parts[0]!r} is not a number") from None
        if order and t < order[-1]:
            raise InputError(f"{path}: line {n}: time goes back")
        if parts[1] == "add":
            if parts[2] in alive:
                raise InputError(f"{path}: line {n}: {parts[2]} added twice")
            alive.add(parts[2])
        else:
            if parts[2] not in alive:
                raise InputError(f"{path}: line {n}: remove of {parts[2]}, which is not in the pool")
            alive.remove(parts[2])
        if t not in by_time:
            by_time[t] = [0, 0]
            order.append(t)
        by_time[t][0 if parts[1] == "add" else 1] += 1
    if not order:
        raise InputError(f"{path}: empty trace")
    return by_time, order


# ---------------------------------------------------------------- format C
_C_LINE = re.compile(r"^(\d{4}-\d{2}-\d{2}),\s*(\d{2}:\d{2}:\d{2}),\s*(\d+)$")
_C_NAME = re.compile(r"(?P<gpu>[a-z0-9]+)x(?P<n>\d+)-(?P<zone>[a-z]+\d)(?P<suffix>[a-z])")


def load_sampled_counts(
    path: str | Path,
    *,
    gpu: str | None = None,
    zone: str | None = None,
    gpu_map: dict[str, str] | None = None,
) -> AvailabilityTrace:
    """Format C: ``YYYY-MM-DD, HH:MM:SS, count`` samples (local time, tz unknown).

    A file that writes each sample three times (at t, t+60 s, t+120 s, as
    ``v100x1-east1c.txt`` does, leaving it unsorted) keeps the first row of each
    group.  A drop between samples is a preemption of at least that many VMs.
    """
    lines = _lines(path)
    stem = Path(path).name.lower()
    m = _C_NAME.search(stem)
    notes: list[str | None] = []
    if gpu is None:
        if not m:
            raise InputError(f"{path}: cannot tell the GPU type from the file name; pass the GPU type")
        gpu, note = map_spot_gpu(m["gpu"], gpu_map)
        notes.append(note)
    else:
        gpu = normalize_gpu_name(gpu)
    if zone is None:
        if not m:
            raise InputError(f"{path}: cannot tell the zone from the file name; pass the zone")
        zone = f"us-{m['zone']}-{m['suffix']}"
    zone = parse_zone(zone).name
    rows: list[tuple[datetime, int]] = []
    for n, ln in enumerate(lines, 1):
        mm = _C_LINE.match(ln)
        if not mm:
            raise InputError(f"{path}: line {n}: expected 'YYYY-MM-DD, HH:MM:SS, count', got {ln!r}")
        rows.append((datetime.fromisoformat(f"{mm[1]}T{mm[2]}"), int(mm[3])))
    if not rows:
        raise InputError(f"{path}: empty trace")
    if _is_triplicated(rows):
        rows = rows[::3]
        notes.append("every sample written three times; kept the first row of each group")
    if any(b[0] < a[0] for a, b in zip(rows, rows[1:])):
        raise InputError(f"{path}: samples are not in time order")
    t0 = rows[0][0]
    key = (gpu, zone)
    samples = [((d - t0).total_seconds(), {key: c}) for d, c in rows]
    return build_trace(
        samples, keys=(key,), start_epoch_s=None, end_s=samples[-1][0],
        source=str(path), notes=_notes(*notes, f"starts {t0.isoformat()} local time"),
    )


def _is_triplicated(rows: list[tuple[datetime, int]]) -> bool:
    groups = [rows[i:i + 3] for i in range(0, len(rows) - 2, 3)]
    if len(groups) < 2:
        return False
    return all(
        g[1][1] == g[0][1] == g[2][1]
        and (g[1][0] - g[0][0]).total_seconds() == 60
        and (g[2][0] - g[0][0]).total_seconds() == 120
        for g in groups
    )


# ---------------------------------------------------------------- format D
_D_LINE = re.compile(r"^\[(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.\d+)?Z?\]\s+(.*)$")
_D_CREATED = re.compile(r"^Created instance (\S+) with (\d+) GPU\(s\) of type (\S+) in zone (\S+)$")
_D_NOT_RUNNING = re.compile(r"^Instance (\S+) not running in zone (\S+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeConfig:
    """One probed configuration of a format-D log and its up intervals (s since log start)."""

    gpu: str            # as logged, e.g. "nvidia-tesla-k80" or "v100"
    zone: str
    gpus_per_vm: int
    up_intervals: tuple[tuple[float, float], ...]
    preempted: tuple[bool, ...]   # per interval: ended by a detected preemption

    @property
    def num_obtained(self) -> int:
        return len(self.up_intervals)

    @property
    def num_preemptions(self) -> int:
        return sum(self.preempted)

    def uptime_fraction(self, window_s: float) -> float:
        return sum(b - a for a, b in self.up_intervals) / window_s if window_s > 0 else 0.0

    def lifetimes_h(self) -> list[float]:
        return [(b - a) / 3600 for (a, b), p in zip(self.up_intervals, self.preempted) if p]


def parse_probe_log(path: str | Path) -> tuple[list[ProbeConfig], float]:
    """Format D: per-configuration up intervals, and the log's window in seconds.

    Up from ``Created`` until the next ``not running`` of that VM (a preemption,
    detected up to one sweep late) or the end of the log.  ``not running`` after
    a failed creation (GCP) is not a preemption: the VM was never up.
    """
    lines = _lines(path)
    t0: datetime | None = None
    last = 0.0
    up_since: dict[str, tuple[tuple[str, str, int], float]] = {}
    intervals: dict[tuple[str, str, int], list[tuple[float, float, bool]]] = defaultdict(list)
    seen: list[tuple[str, str, int]] = []
    for n, ln in enumerate(lines, 1):
        m = _D_LINE.match(ln)
        if not m:
            raise InputError(f"{path}: line {n}: not a probe-log line: {ln[:60]!r}")
        when = datetime.fromisoformat(m[1])
        t0 = t0 or when
        t = (when - t0).total_seconds()
        last = max(last, t)
        msg = m[2].strip()
        if c := _D_CREATED.match(msg):
            cfg = (c[3], c[4], int(c[2]))
            if cfg not in seen:
                seen.append(cfg)
            up_since[c[1]] = (cfg, t)
        elif c := _D_NOT_RUNNING.match(msg):
            if c[1] in up_since:
                cfg, since = up_since.pop(c[1])
                intervals[cfg].append((since, t, True))
    if t0 is None:
        raise InputError(f"{path}: empty probe log")
    for cfg, since in up_since.values():
        intervals[cfg].append((since, last, False))
    configs = [
        ProbeConfig(
            gpu=cfg[0], zone=cfg[1], gpus_per_vm=cfg[2],
            up_intervals=tuple((a, b) for a, b, _ in sorted(intervals[cfg])),
            preempted=tuple(p for _, _, p in sorted(intervals[cfg])),
        )
        for cfg in seen
    ]
    return configs, last


def load_probe_log(path: str | Path, *, gpu_map: dict[str, str] | None = None) -> AvailabilityTrace:
    """Format D as availability: GPUs up per (GPU, zone), summing 1- and 8-GPU VMs.

    Configurations never obtained still get a column (always 0): that they never
    came up is the measurement.  Only configurations seen in a ``Created`` line
    are known, though, since failed AWS launches do not name their zone.
    """
    configs, window = parse_probe_log(path)
    notes: list[str | None] = []
    deltas: dict[float, dict[GpuZone, int]] = defaultdict(lambda: defaultdict(int))
    events: list[PreemptionEvent] = []
    keys: list[GpuZone] = []
    for cfg in configs:
        gpu, note = map_spot_gpu(cfg.gpu, gpu_map)
        notes.append(note)
        key = (gpu, parse_zone(cfg.zone).name)
        if key not in keys:
            keys.append(key)
        for (a, b), pre in zip(cfg.up_intervals, cfg.preempted):
            deltas[a][key] += cfg.gpus_per_vm
            if pre:
                deltas[b][key] -= cfg.gpus_per_vm
                events.append(PreemptionEvent(time_s=b, gpu=key[0], zone=key[1], num_gpus=cfg.gpus_per_vm))
    current = {k: 0 for k in keys}
    samples: list[tuple[float, dict[GpuZone, int]]] = [(0.0, dict(current))]
    for t in sorted(deltas):
        for k, d in deltas[t].items():
            current[k] += d
        samples.append((t, dict(current)))
    return build_trace(
        samples, keys=tuple(sorted(keys)), preemptions=events, derive_preemptions=False,
        end_s=window, source=str(path),
        notes=_notes(*notes, "preemptions detected up to one probe sweep (10.7-12 min) late"),
    )
