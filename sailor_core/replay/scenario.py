"""What one replay is of, besides the trace and the costs of a change: the policy that decides,
the market it rents in, the goal it works to, and who is told what it will ask next."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sailor_core.controller import ControllerConfig, PlanFn
from sailor_core.traces import GpuZone

PriceFn = Callable[[str, str, float], float]  # (gpu, zone, time_s) -> USD per GPU-hour


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayPolicy:
    """The controller's configuration and the planners it asks: ``plan_fn`` (the fastest plans)
    and ``cost_plan_fn`` (the planner's cheapest ones, ``decide``'s; None: not asked).  ``name``
    labels the result."""

    config: ControllerConfig
    plan_fn: PlanFn
    cost_plan_fn: PlanFn | None = None
    name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Market:
    """What GPUs cost: spot at ``price_fn``, whose prices change at ``price_change_times`` (each
    an event of the replay); and the on-demand GPUs per pool the controller may rent besides the
    trace's spot pools (never preempted), at ``on_demand_price_fn`` (None: ``price_fn``)."""

    price_fn: PriceFn
    price_change_times: tuple[float, ...] = ()
    on_demand_available: Mapping[GpuZone, int] = field(default_factory=dict)
    on_demand_price_fn: PriceFn | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Goal:
    """The work (in samples) and what it must fit in: a budget (None: none) and a deadline in
    seconds from the trace's start (None: none; the controller's ``time_left_s``)."""

    samples_target: float
    budget_usd: float | None = None
    deadline_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Lookahead:
    """Told after every decision which availabilities the controller will likely ask the planner
    about in its next ``num_decisions`` re-plans (``lookahead.upcoming_requests``), so that they
    can be answered ahead."""

    prefetch: Callable[[list[dict[GpuZone, int]]], None]
    num_decisions: int = 2
