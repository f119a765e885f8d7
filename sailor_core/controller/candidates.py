"""The plans a re-plan weighs: what the controller asks the planner (every pool, each GPU type
alone, without the stormiest pools, the cheapest above a floor; with a budget none of those
finishes within, the fastest of the cheapest plans that does) and each plan on its markets
(spot first, then its stormiest pools on demand)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from sailor_core.controller.options import (
    CostPlanFn,
    GpuZone,
    PlanFn,
    PlanOption,
    floors_on_grid,
    restrict,
    with_on_demand,
)
from sailor_core.controller.state import ControllerConfig, ControllerState

def planner_requests(avail: Mapping[GpuZone, int], state: ControllerState, config: ControllerConfig
                     ) -> list[dict[GpuZone, int]]:
    """The availabilities a re-plan asks ``plan_fn`` about, in order: every allowed pool (spot
    and on-demand together when the job may rent on demand), each GPU type alone (its best
    plan), then without the stormiest pools, one more left out each time (its best plan).
    The replay's lookahead guesses the same."""
    od = restrict(state.on_demand_available, config.gpu_types)
    ask = _combined(avail, od)
    out = [ask]
    types = sorted({g for g, _ in ask})
    if config.per_type_options and len(types) > 1:
        out += [restrict(ask, (gpu,)) for gpu in types]
    if config.calm_options:  # a stormy pool's spot GPUs are left out, its on-demand ones stay
        out += [_combined(calmer, od) for calmer in _calmer_pools(avail, state, keep_one=not od)]
    return out


def candidates(avail: Mapping[GpuZone, int], state: ControllerState, config: ControllerConfig, plan_fn: PlanFn,
               cost_plan_fn: CostPlanFn | None, *, useful: float) -> list[PlanOption]:
    """What the planner offers (``planner_requests``; the first request's plans all, the others'
    best), with the cost objective or a deadline also the cheapest plans (``cheap_floors``) and
    each pool's best alone, each on its markets."""
    asks = planner_requests(avail, state, config)
    options = list(plan_fn(asks[0]))
    for ask in asks[1:]:
        options += list(plan_fn(ask))[:1]
    if cost_plan_fn is not None and config.ranking.asks_cheapest(deadline=math.isfinite(state.time_left_s)):
        for floor in cheap_floors(state, config, useful=useful):
            options += list(cost_plan_fn(asks[0], floor))
        # Each pool alone, its fastest plan: one zone pays no cross-zone traffic, and is often the
        # cheapest plan just fast enough (what a one-zone managed job runs), which the cost search
        # over every pool, capped and asked on the floors' grid, can miss.
        options += [o for k, n in sorted(asks[0].items()) for o in list(plan_fn({k: n}))[:1]]
    return _on_markets(_distinct(options), avail, state, config)


def _on_markets(options: Sequence[PlanOption], avail: Mapping[GpuZone, int], state: ControllerState,
                config: ControllerConfig) -> list[PlanOption]:
    od_avail = restrict(state.on_demand_available, config.gpu_types)
    if not od_avail:
        return list(options)
    return [v for o in options for v in _market_variants(o, avail, od_avail, state)]


# Searches of the budget's bisection (the cheapest plan, then one per halving): 8 floors per
# doubling over up to 8 doublings of throughput between the cheapest and the fastest plan.
_MAX_BUDGET_SEARCHES = 7


def within_budget(avail: Mapping[GpuZone, int], state: ControllerState, config: ControllerConfig,
                  cost_plan_fn: CostPlanFn, *, finishes: Callable[[PlanOption], bool],
                  fastest_samples_per_s: float) -> list[PlanOption]:
    """The planner's cheapest plans, searched for the fastest that finishes within the budget left
    (``finishes``), for when no plan the fast searches offered does: a budget that cannot pay for
    the fastest plans can still pay for a slower, cheaper one, which the job must run rather than
    spend the budget on a plan that stops before the end.  The cheapest plan first (above the
    job's floor), then a bisection over the floors of ``floors_on_grid``'s grid between the
    fastest plan that finishes and ``fastest_samples_per_s`` (what the fast searches offered):
    the cheapest plans above a floor that finish raise the lower end, those that do not lower the
    upper.  Every plan seen is returned (each on its markets); [] when the planner has none."""
    ask = planner_requests(avail, state, config)[0]
    job_floor = config.terms.min_throughput_samples_per_s
    seen = list(cost_plan_fn(ask, job_floor))
    fit = [o.throughput_samples_per_s for o in seen if finishes(o)]
    if fit and fastest_samples_per_s > max(fit):
        lo, hi = math.floor(_grid_index(max(fit))), math.ceil(_grid_index(fastest_samples_per_s))
        for _ in range(_MAX_BUDGET_SEARCHES - 1):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            found = list(cost_plan_fn(ask, max(2.0 ** (mid / 8.0), job_floor or 0.0)))
            seen += found
            ok = [o.throughput_samples_per_s for o in found if finishes(o)]
            if ok:
                lo = max(mid, math.floor(_grid_index(max(ok))))
            else:
                hi = mid
    return _on_markets(_distinct(seen), avail, state, config)


def _grid_index(samples_per_s: float) -> float:
    """Where a throughput lies on the floors' grid (``floors_on_grid``: 8 steps per doubling)."""
    return 8.0 * math.log2(samples_per_s)


def cheap_floors(state: ControllerState, config: ControllerConfig, *, useful: float) -> tuple[float | None, ...]:
    """The throughput floors of the planner's cheapest plans: the job's floor and, with a deadline,
    what finishing in time needs (the samples left over the time left after a change, divided
    by the share of the time the plan in use trains, ``useful``), on ``floors_on_grid``
    (the grid's floors just below and above it); (None,): no floor."""
    floor = config.terms.min_throughput_samples_per_s or 0.0
    if math.isfinite(state.time_left_s):
        remaining = max(0.0, state.samples_target - state.samples_done)
        window_s = state.time_left_s - config.change_cost_s
        if window_s > 0 and remaining > 0:
            need = remaining / window_s / max(useful, 1e-3)
            if need > floor:
                return floors_on_grid(need)
    return (floor,) if floor > 0 else (None,)


def _combined(spot: Mapping[GpuZone, int], on_demand: Mapping[GpuZone, int]) -> dict[GpuZone, int]:
    out = dict(spot)
    for k, n in on_demand.items():
        out[k] = out.get(k, 0) + n
    return {k: n for k, n in out.items() if n > 0}


def _storminess(state: ControllerState, k: GpuZone) -> float:
    """How often a pool takes one given GPU of ours: its event rate times an event's share."""
    return state.preemption_rate_per_s.get(k, 0.0) * state.preemption_share.get(k, 1.0)


def _calmer_pools(avail: Mapping[GpuZone, int], state: ControllerState, *, keep_one: bool = True
                  ) -> list[dict[GpuZone, int]]:
    """``avail`` without its stormiest pool, then without the two stormiest, ... (pools with
    a preemption rate only; with ``keep_one``, at least one pool is always left)."""
    stormy = sorted((k for k in avail if _storminess(state, k) > 0), key=lambda k: (-_storminess(state, k), k))
    out, left = [], dict(avail)
    for k in stormy:
        del left[k]
        if not left and keep_one:
            break
        out.append(dict(left))
    return out


def _distinct(options: Sequence[PlanOption]) -> list[PlanOption]:
    """The options, each plan once (the first time it is offered)."""
    seen, out = set(), []
    for o in options:
        key = (tuple(sorted(o.gpus.items())), tuple(sorted(o.on_demand.items())),
               o.throughput_samples_per_s, o.usd_per_hr, o.egress_usd_per_hr)
        if key not in seen:
            seen.add(key)
            out.append(o)
    return out


def _market_variants(option: PlanOption, spot: Mapping[GpuZone, int], od_avail: Mapping[GpuZone, int],
                     state: ControllerState) -> list[PlanOption]:
    """``option`` (planned on spot and on-demand pools together) on its markets: spot first
    (on demand only what spot cannot hold), then with its stormiest pools wholly on demand, one
    more each time, until every GPU is (as far as the on-demand capacity allows)."""
    if not option.on_demand_premium_usd_per_hr:
        return [option] if option.fits_in(spot) else []
    over = {k: n - spot.get(k, 0) for k, n in option.gpus.items() if n > spot.get(k, 0)}
    if any(n > od_avail.get(k, 0) or k not in option.on_demand_premium_usd_per_hr for k, n in over.items()):
        return []
    base = with_on_demand(option, over) if over else option
    variants, moved = [base], dict(over)
    for k in sorted(base.gpus, key=lambda k: (-_storminess(state, k), k)):
        n = option.gpus[k]
        if k not in option.on_demand_premium_usd_per_hr or n > od_avail.get(k, 0):
            continue
        moved[k] = n
        variants.append(with_on_demand(option, moved))
    return variants
