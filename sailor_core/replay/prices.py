"""Optional spot price series: USD per GPU-hour per (GPU type, zone) over time.

Same layout as Sailor's availability CSV (``,Timestamp,<gpu>_<zone>...``) with
prices instead of counts; times are seconds since the first row (or Unix
seconds, made relative to the first row).  Pools without a column keep the
catalog price.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from sailor_core.errors import InputError
from sailor_core.traces.model import GpuZone
from sailor_core.traces.sailor_csv import _read_text, parse_gpu_zone_column


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceSeries:
    times_s: tuple[float, ...]
    rows: tuple[dict[GpuZone, float], ...]

    def change_times(self) -> tuple[float, ...]:
        return self.times_s[1:]

    def price_at(self, gpu: str, zone: str, time_s: float) -> float | None:
        i = max(bisect.bisect_right(self.times_s, time_s) - 1, 0)
        return self.rows[i].get((gpu, zone))

    def price_fn(self, *, fallback):
        def fn(gpu: str, zone: str, time_s: float) -> float:
            p = self.price_at(gpu, zone, time_s)
            return fallback(gpu, zone, time_s) if p is None else p

        return fn


def load_price_series(path: str | Path) -> PriceSeries:
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text.replace("\r", "")))
    header = [h.strip() for h in next(reader, [])]
    if "Timestamp" not in header:
        raise InputError(f"{path}: price series needs a 'Timestamp' column")
    ts = header.index("Timestamp")
    cols = [(i, parse_gpu_zone_column(h, where=str(path))) for i, h in enumerate(header) if i != ts and h]
    times: list[float] = []
    rows: list[dict[GpuZone, float]] = []
    for n, fields in enumerate(reader, start=2):
        if not any(f.strip() for f in fields):
            continue
        try:
            t = float(fields[ts])
            row = {key: float(fields[i]) for i, key in cols}
        except (ValueError, IndexError):
            raise InputError(f"{path}: line {n}: expected numbers in every column") from None
        if any(not math.isfinite(v) or v < 0 for v in row.values()):
            raise InputError(f"{path}: line {n}: prices must be >= 0 USD per GPU-hour")
        times.append(t)
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: the price series has no rows")
    t0 = times[0]
    rel = [t - t0 for t in times]
    if any(b < a for a, b in zip(rel, rel[1:])):
        raise InputError(f"{path}: Timestamp goes back in time")
    return PriceSeries(times_s=tuple(rel), rows=tuple(rows))
