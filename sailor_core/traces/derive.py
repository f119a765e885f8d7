"""Realistic multi-day, multi-zone, multi-GPU-type traces derived from measured statistics.

Each (GPU type, zone) pool of capacity N evolves on a 1-minute grid (the
resolution of Bamboo's event traces) by three processes whose parameters come
from one measured trace (spot_traces README, section 2.1, recomputed by
``pool_statistics`` and checked in tests/traces/test_traces_real.py):

* preemption events, Poisson with the measured mean time between preemptions
  (duration / number of events);
* each event takes a bulk of nodes, geometric with the measured mean bulk
  (nodes lost / events) as a fraction of the pool, capped at the measured
  largest single drop;
* each missing node comes back after an exponential time whose mean R follows
  from the measured mean availability a (Little's law at steady state: the loss
  rate N/MTBP * bulk equals the return rate N (1 - a) / R);

plus rare zone stock-outs, when the pool falls to 0: Bamboo's two g4dn format-A
files start with 5.98 h and 7.07 h at 0 and none of the other 8 pool traces has
one, so 2 stock-outs in 253.9 observed pool-hours, mean length 6.5 h.
Pools are independent of each other (the measurements hold one pool each).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sailor_core.catalog import normalize_gpu_name
from sailor_core.errors import InputError, UnknownNameError
from sailor_core.traces.model import AvailabilityTrace, GpuZone, build_trace
from sailor_core.zones import parse_zone

_H = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolBehaviour:
    """How one measured pool behaved, normalised by its capacity (its largest count)."""

    source: str
    mtbp_s: float                 # duration / preemption events
    mean_bulk_fraction: float     # nodes lost per event / capacity
    largest_bulk_fraction: float  # largest single drop / capacity
    mean_available_fraction: float  # time-weighted mean count / capacity


# Figures from data/spot_traces/README.md, section 2.1 (duration, events,
# nodes preempted, largest drop, mean and max nodes).
MEASURED_BEHAVIOURS: dict[str, PoolBehaviour] = {
    "aws-p3": PoolBehaviour(  # 11.37 h, 79 events, 167 nodes, largest 6, mean 24.03 of 32
        source="bamboo/traces/p3-trace.csv",
        mtbp_s=11.37 * _H / 79, mean_bulk_fraction=167 / 79 / 32,
        largest_bulk_fraction=6 / 32, mean_available_fraction=24.03 / 32,
    ),
    "aws-g4dn": PoolBehaviour(  # 10.77 h, 48 events, 74 nodes, largest 5, mean 12.76 of 24
        source="bamboo/traces/g4dn-trace.csv",
        mtbp_s=10.77 * _H / 48, mean_bulk_fraction=74 / 48 / 24,
        largest_bulk_fraction=5 / 24, mean_available_fraction=12.76 / 24,
    ),
    "aws-p2": PoolBehaviour(  # 88.70 h, 112 events, 178 nodes, largest 8, mean 15.50 of 16
        source="bamboo/doc/data/aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv",
        mtbp_s=88.70 * _H / 112, mean_bulk_fraction=178 / 112 / 16,
        largest_bulk_fraction=8 / 16, mean_available_fraction=15.50 / 16,
    ),
    "gcp-v100": PoolBehaviour(  # 24.17 h, 55 events, >= 518 nodes, largest 40, mean 76.33 of 80
        source="bamboo/traces/gcloud/v100x1-east1c.txt",
        mtbp_s=24.17 * _H / 55, mean_bulk_fraction=518 / 55 / 80,
        largest_bulk_fraction=40 / 80, mean_available_fraction=76.33 / 80,
    ),
    "gcp-a100": PoolBehaviour(  # 27.02 h, 36 events, >= 154 nodes, largest 36, mean 57.30 of 64
        source="bamboo/traces/gcloud/a100x1-east1b.txt",
        mtbp_s=27.02 * _H / 36, mean_bulk_fraction=154 / 36 / 64,
        largest_bulk_fraction=36 / 64, mean_available_fraction=57.30 / 64,
    ),
}
STOCKOUT_RATE_PER_S = 2 / (253.9 * _H)
STOCKOUT_MEAN_S = 6.5 * _H


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    gpu: str
    zone: str
    capacity: int       # GPUs (1-GPU nodes, as in every measured pool trace)
    behaviour: str      # key of MEASURED_BEHAVIOURS


# Two ready-made multi-day scenarios used by the benchmarks.  Pools are kept to
# 8-16 GPUs (a few nodes per zone) so re-planning stays affordable on a laptop.
DERIVED_PRESETS: dict[str, tuple[float, tuple[PoolSpec, ...]]] = {
    "aws-3d": (3 * 24 * _H, (
        PoolSpec(gpu="V100-16", zone="us-east-1a", capacity=16, behaviour="aws-p3"),
        PoolSpec(gpu="V100-16", zone="us-east-1b", capacity=16, behaviour="aws-p3"),
        PoolSpec(gpu="V100-16", zone="us-east-1c", capacity=8, behaviour="aws-p3"),
        PoolSpec(gpu="T4", zone="us-east-1c", capacity=12, behaviour="aws-g4dn"),
        PoolSpec(gpu="T4", zone="us-east-1d", capacity=12, behaviour="aws-g4dn"),
        PoolSpec(gpu="T4", zone="us-west-2a", capacity=8, behaviour="aws-p2"),
    )),
    "gcp-4d": (4 * 24 * _H, (
        PoolSpec(gpu="A100-40", zone="us-central1-a", capacity=16, behaviour="gcp-a100"),
        PoolSpec(gpu="A100-40", zone="us-east1-b", capacity=16, behaviour="gcp-a100"),
        PoolSpec(gpu="A100-40", zone="us-west1-b", capacity=8, behaviour="gcp-a100"),
        PoolSpec(gpu="V100-16", zone="us-central1-a", capacity=16, behaviour="gcp-v100"),
        PoolSpec(gpu="V100-16", zone="us-east1-c", capacity=16, behaviour="gcp-v100"),
        PoolSpec(gpu="V100-16", zone="us-west1-b", capacity=8, behaviour="gcp-v100"),
    )),
}


def return_mean_s(b: PoolBehaviour) -> float:
    """Mean time a lost node stays missing, from Little's law (see the module doc)."""
    loss_rate_per_s = b.mean_bulk_fraction / b.mtbp_s  # fraction of capacity lost per second
    return (1.0 - b.mean_available_fraction) / loss_rate_per_s


def derive_trace(
    pools: tuple[PoolSpec, ...] | list[PoolSpec],
    *,
    duration_s: float,
    seed: int = 0,
    step_s: float = 60.0,
    stockouts: bool = True,
    source: str = "derived",
) -> AvailabilityTrace:
    if duration_s <= 0 or step_s <= 0:
        raise InputError("derived trace: duration and step must be positive")
    if not pools:
        raise InputError("derived trace: no pools")
    rng = random.Random(seed)
    keys: list[GpuZone] = []
    states = []
    for p in pools:
        if p.behaviour not in MEASURED_BEHAVIOURS:
            raise InputError(f"unknown pool behaviour {p.behaviour!r}; known: {', '.join(MEASURED_BEHAVIOURS)}")
        if p.capacity < 1:
            raise InputError(f"pool {p.gpu} in {p.zone}: capacity must be >= 1")
        try:
            key = (normalize_gpu_name(p.gpu), parse_zone(p.zone).name)
        except UnknownNameError as exc:
            raise InputError(f"derived trace: {exc}") from None
        if key in keys:
            raise InputError(f"derived trace: pool {key} given twice")
        keys.append(key)
        b = MEASURED_BEHAVIOURS[p.behaviour]
        states.append({"n": p.capacity, "cap": p.capacity, "b": b, "ret": return_mean_s(b), "out_until": -1.0})
    samples: list[tuple[float, dict[GpuZone, int]]] = [(0.0, {k: s["n"] for k, s in zip(keys, states)})]
    num_steps = int(math.ceil(duration_s / step_s))
    for i in range(1, num_steps + 1):
        t = i * step_s
        changed = False
        for s in states:
            b: PoolBehaviour = s["b"]
            n, cap = s["n"], s["cap"]
            if t < s["out_until"]:
                continue
            if s["out_until"] >= 0 and t >= s["out_until"]:
                s["out_until"] = -1.0  # stock-out over: nodes return one by one below
            if stockouts and rng.random() < STOCKOUT_RATE_PER_S * step_s:
                s["n"], s["out_until"] = 0, t + rng.expovariate(1.0 / STOCKOUT_MEAN_S)
                changed |= n != 0
                continue
            missing = cap - n
            back = sum(1 for _ in range(missing) if rng.random() < step_s / s["ret"])
            lost = 0
            if n > 0 and rng.random() < step_s / b.mtbp_s:
                mean_bulk = max(1.0, b.mean_bulk_fraction * cap)
                largest = max(1, round(b.largest_bulk_fraction * cap))
                p_geo = 1.0 / mean_bulk
                lost = 1 + (int(math.log(1.0 - rng.random()) / math.log(1.0 - p_geo)) if p_geo < 1 else 0)
                lost = min(lost, largest, n)
            s["n"] = n + back - lost
            changed |= s["n"] != n
        if changed:
            samples.append((t, {k: s["n"] for k, s in zip(keys, states)}))
    return build_trace(
        samples, keys=tuple(keys), end_s=num_steps * step_s, source=source,
        notes=(f"derived (seed {seed}) from the statistics of "
               + ", ".join(sorted({MEASURED_BEHAVIOURS[p.behaviour].source for p in pools})),),
    )


def derive_preset(name: str, *, seed: int = 0) -> AvailabilityTrace:
    if name not in DERIVED_PRESETS:
        raise InputError(f"unknown derived trace {name!r}; known: {', '.join(DERIVED_PRESETS)}")
    duration_s, pools = DERIVED_PRESETS[name]
    return derive_trace(pools, duration_s=duration_s, seed=seed, source=f"derived:{name}:{seed}")
