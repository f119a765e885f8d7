"""Plan options as the controller sees them, and the planner behind an injectable function."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sailor_core.errors import InfeasibleError

GpuZone = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOption:
    """One runnable plan: what it uses, how fast it trains, what it costs."""

    gpus: Mapping[GpuZone, int]          # GPUs the plan holds per (type, zone)
    throughput_samples_per_s: float
    usd_per_hr: float
    plan: Any = None                     # sailor_core.plan.Plan (None for test planners)
    label: str = ""

    @property
    def num_gpus(self) -> int:
        return sum(self.gpus.values())

    def fits_in(self, available: Mapping[GpuZone, int]) -> bool:
        return all(available.get(k, 0) >= n for k, n in self.gpus.items())

    def samples_per_usd(self) -> float:
        return self.throughput_samples_per_s * 3600.0 / self.usd_per_hr if self.usd_per_hr > 0 else float("inf")


# A planning function: availability -> options, best first; empty when nothing runs.
PlanFn = Callable[[Mapping[GpuZone, int]], Sequence[PlanOption]]


def gpus_of_plan(plan: Any) -> dict[GpuZone, int]:
    """GPUs per (type, zone) a ``Plan`` holds (each replica is ``tp`` GPUs)."""
    out: dict[GpuZone, int] = {}
    for stage in plan.stages:
        for r in stage.replicas:
            out[(r.gpu, r.zone)] = out.get((r.gpu, r.zone), 0) + r.tp_degree
    return out


def restrict(available: Mapping[GpuZone, int], gpu_types: Sequence[str] | None) -> dict[GpuZone, int]:
    return {k: n for k, n in available.items() if n > 0 and (gpu_types is None or k[0] in gpu_types)}


@dataclass(slots=True, kw_only=True)
class CachedPlanner:
    """Memoises a PlanFn per distinct availability.

    Beyond exact hits it reuses a result for availability A' when an earlier
    call on A found best plan using U with U <= A' <= A: the best over A is
    also the best over any subset of A that still contains it.  (Exact for an
    exhaustive planner; for a heuristic one it is the answer it gave on the
    larger set.)  This is what lets a multi-day trace replay in seconds.
    """

    plan_fn: PlanFn
    num_calls: int = 0
    num_hits: int = 0
    planner_time_s: float = 0.0
    _exact: dict[frozenset, tuple[PlanOption, ...]] = field(default_factory=dict)
    _covering: list[tuple[dict[GpuZone, int], tuple[PlanOption, ...]]] = field(default_factory=list)

    def __call__(self, available: Mapping[GpuZone, int]) -> tuple[PlanOption, ...]:
        avail = {k: n for k, n in available.items() if n > 0}
        key = frozenset(avail.items())
        hit = self._exact.get(key)
        if hit is None:
            for big, options in reversed(self._covering):
                if options and options[0].fits_in(avail) and all(big.get(k, 0) >= n for k, n in avail.items()):
                    hit = tuple(o for o in options if o.fits_in(avail))
                    break
        if hit is not None:
            self.num_hits += 1
            self._exact[key] = hit
            return hit
        t0 = time.perf_counter()
        options = tuple(self.plan_fn(avail)) if avail else ()
        self.planner_time_s += time.perf_counter() - t0
        self.num_calls += 1
        self._exact[key] = options
        if options:
            self._covering.append((avail, options))
        return options


def planner_plan_fn(
    *,
    model: str,
    global_batch_size: int | None = None,
    objective: str = "throughput",
    max_usd_per_hour: float | None = None,
    min_throughput_samples_per_s: float | None = None,
    top_n: int = 5,
    spot: bool = True,
    **knobs: Any,
) -> PlanFn:
    """A PlanFn backed by ``sailor_core.planner.plan_job`` (imported on first use)."""

    def plan(available: Mapping[GpuZone, int]) -> list[PlanOption]:
        from sailor_core.planner import make_request, plan_job

        if not any(available.values()):
            return []
        request = make_request(
            model=model, availability=available, objective=objective,
            global_batch_size=global_batch_size, max_usd_per_hour=max_usd_per_hour,
            min_throughput_samples_per_s=min_throughput_samples_per_s, top_n=top_n, spot=spot, **knobs,
        )
        try:
            result = plan_job(request)
        except InfeasibleError:
            return []
        return [option_from_candidate(c) for c in result.candidates]

    return plan


def option_from_candidate(candidate: Any) -> PlanOption:
    """PlanOption from a planner candidate (``.plan`` and ``.sim``, the simulator's SimResult)."""
    sim = candidate.sim
    gpus = gpus_of_plan(candidate.plan)
    return PlanOption(
        gpus=gpus,
        throughput_samples_per_s=float(sim.throughput_samples_per_s),
        usd_per_hr=float(sim.usd_per_hour),
        plan=candidate.plan,
        label=describe_gpus(gpus),
    )


def describe_gpus(gpus: Mapping[GpuZone, int]) -> str:
    return ", ".join(f"{n}x{g}@{z}" for (g, z), n in sorted(gpus.items()) if n)
