"""Sailor's GPU availability CSV (``simulations/configs/gpu_trace_*.csv``).

Columns: an unnamed row index, ``Timestamp`` (Unix seconds), then one column per
``<gpu>_<zone>`` with the number of GPUs of that type available in that zone.
Sailor's simulator merges consecutive identical rows; each distinct row is one
planning scenario lasting until the next timestamp.  We do the same.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from sailor_core.catalog import normalize_gpu_name
from sailor_core.errors import InputError, UnknownNameError
from sailor_core.traces.model import AvailabilityTrace, GpuZone, build_trace
from sailor_core.zones import parse_zone


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"trace file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read trace file {str(path)!r}: {exc}") from None


def parse_gpu_zone_column(name: str, *, where: str) -> GpuZone:
    gpu, sep, zone = name.strip().rpartition("_")
    if not sep or not gpu or not zone:
        raise InputError(f"{where}: column {name!r} is not '<gpu>_<zone>'")
    try:
        return normalize_gpu_name(gpu), parse_zone(zone).name
    except UnknownNameError as exc:
        raise InputError(f"{where}: column {name!r}: {exc}") from None


def load_gpu_trace(path: str | Path) -> AvailabilityTrace:
    """Load a Sailor availability CSV; rows' times are seconds since the first row."""
    return parse_gpu_trace(_read_text(path), source=str(path))


def parse_gpu_trace(text: str, *, source: str = "<text>") -> AvailabilityTrace:
    reader = csv.reader(io.StringIO(text.replace("\r", "")))
    header = next(reader, None)
    if not header or "Timestamp" not in [h.strip() for h in header]:
        raise InputError(f"{source}: not a Sailor GPU trace (no 'Timestamp' column in the header)")
    header = [h.strip() for h in header]
    ts_col = header.index("Timestamp")
    # The unnamed column is pandas' row index; every other named one is a pool.
    gpu_cols = [(i, h) for i, h in enumerate(header) if i != ts_col and h]
    if not gpu_cols:
        raise InputError(f"{source}: no '<gpu>_<zone>' columns")
    keys: list[GpuZone] = []
    for _, h in gpu_cols:
        key = parse_gpu_zone_column(h, where=source)
        if key in keys:
            raise InputError(f"{source}: column for {key[0]} in {key[1]} appears twice")
        keys.append(key)

    samples: list[tuple[float, dict[GpuZone, int]]] = []
    first_epoch: float | None = None
    for line_no, fields in enumerate(reader, start=2):
        if not fields or all(not f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            raise InputError(f"{source}: line {line_no} has {len(fields)} fields, the header has {len(header)}")
        try:
            ts = float(fields[ts_col])
        except ValueError:
            raise InputError(f"{source}: line {line_no}: Timestamp {fields[ts_col]!r} is not a number") from None
        if not math.isfinite(ts):
            raise InputError(f"{source}: line {line_no}: Timestamp is not finite")
        counts: dict[GpuZone, int] = {}
        for (col, name), key in zip(gpu_cols, keys):
            raw = fields[col].strip()
            try:
                value = float(raw)
            except ValueError:
                raise InputError(f"{source}: line {line_no}: {name} = {raw!r} is not a number") from None
            if not math.isfinite(value) or value < 0 or value != int(value):
                raise InputError(f"{source}: line {line_no}: {name} = {raw!r} is not a whole number >= 0")
            counts[key] = int(value)
        if first_epoch is None:
            first_epoch = ts
        t = ts - first_epoch
        if samples and t < samples[-1][0]:
            raise InputError(f"{source}: line {line_no}: Timestamp goes back in time")
        samples.append((t, counts))
    if not samples:
        raise InputError(f"{source}: the trace has no rows")
    return build_trace(samples, keys=tuple(keys), start_epoch_s=first_epoch, source=source)


def write_gpu_trace(trace: AvailabilityTrace, path: str | Path) -> None:
    """Write ``trace`` in Sailor's CSV format (Timestamp = start epoch + time_s)."""
    start = trace.start_epoch_s or 0.0
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["", "Timestamp", *[f"{g}_{z}" for g, z in trace.keys]])
    for i, (t, counts) in enumerate(trace.rows):
        w.writerow([i, f"{start + t:.3f}", *[counts[k] for k in trace.keys]])
    Path(path).write_text(out.getvalue())
