"""Planning tasks: the controller's decision on what runs next, over what the clouds offer now.

The decision is ``sailor_core.controller.decide`` (shared with the trace
replay); its plan options come from the controller's planner
(``sailor_core.controller.planner_plan_fn``, the replay's too) on the GPUs
offered now, priced as the whole instances ``sailor_core.job.nodes`` places
them on (what the ledger will actually be charged).  The job's objective and
constraints (``JobSpec.objective``, ``min_throughput_samples_per_s``,
``deadline_h``, the budget) drive every decision, as in the replay: its fastest
plans come from the planner's throughput search, its cheapest (with the cost
objective or a deadline, and once no fast plan finishes within the budget left)
from its cost search, and the preemptions the job has seen per pool (its own
instances') say which pools hold.

A spot job with ``on_demand_gpus`` also offers the controller that many GPUs of
each pool on demand (``on_demand_availability``): it may move the pools that keep
preempting the job there (a mixed plan), and the nodes are then rented and priced
on each replica's market.  The job's caps (``max_gpus_per_zone``, ``max_gpus``)
count the GPUs of both markets: the planner is asked within them (``Planner.within``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from sailor_core.job import recovery
from sailor_core.job import state as js

from sailor_core.job.spec import JobSpec
from sailor_core.job.nodes import NodeRequest, nodes_for_plan, plan_usd_per_hr
from sailor_core.catalog.instances import Offer
from sailor_core.controller import (
    CachedPlanner,
    CheapestPlanner,
    ControllerState,
    Costs,
    Decision,
    Event,
    PlannerPlanFn,
    PlanOption,
    controller_config,
    decide,
    observed_preemption_rates_per_s,
    rate_window_s,
    plan_option,
    planner_plan_fn,
)
from sailor_core.controller.checkpoint_egress import CheckpointEgress
from sailor_core.controller.economics import job_costs
from sailor_core.controller.interim import interim_option, interim_pays
from sailor_core.controller.options import egress_rate_usd_per_hr
from sailor_core.errors import InfeasibleError
from sailor_core.network.storage_egress import bucket_place
from sailor_core.objective import Objective
from sailor_core.planner.ranking import CHEAPEST, FASTEST
from sailor_core.planner.request import DEFAULT_MAX_TP_DEGREE, PlanQuery, SearchSettings
from sailor_core.simulator.simulate import simulate

_log = logging.getLogger(__name__)


def flow_costs(spec: JobSpec) -> Costs:
    """The flow's costs of change for ``spec``'s job, as the controller weighs them
    (``economics.job_costs``: the job's checkpoint reload included, which a change's
    ``state_load`` replaces with what its ranks must receive: the engine hands the state over in
    memory, ``runtime/handover.py``, and the bytes that cross zones are priced, as the ledger
    charges them, as are what its ranks read from a checkpoint bucket in another region: the job's
    bucket, ``checkpoint_egress``); the check before renting charges the same start-up."""
    place = checkpoint_egress(spec).place
    return job_costs(spec.model, bucket=place if place.metered else None)


def availability(offers: Sequence[Offer], *, max_gpus_per_zone: int, max_gpus: int | None,
                 excluded_zones: Sequence[str] = ()) -> dict[tuple[str, str], int]:
    """GPUs the job may use per (type, zone): cheapest per GPU first, ``max_gpus_per_zone`` each, ``max_gpus`` in all."""
    best: dict[tuple[str, str], float] = {}
    for o in offers:
        if o.zone in excluded_zones:
            continue
        key = (o.gpu, o.zone)
        best[key] = min(best.get(key, math.inf), o.usd_per_gpu_hr())
    out: dict[tuple[str, str], int] = {}
    left = math.inf if max_gpus is None else max_gpus
    for key in sorted(best, key=lambda k: (best[k], k)):
        if left <= 0:
            break
        n = int(min(max_gpus_per_zone, left))
        out[key] = n
        left -= n
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferPricing:
    """A plan priced as the whole instances ``nodes_for_plan`` places it on, among ``offers``."""

    offers: tuple[Offer, ...]
    spot: bool  # the job's market; a mixed plan's replicas say their own

    def nodes(self, plan) -> tuple[NodeRequest, ...]:
        return tuple(nodes_for_plan(plan, self.offers, spot=self.spot))

    def __call__(self, plan) -> float:
        return plan_usd_per_hr(nodes_for_plan(plan, self.offers, spot=self.spot))


@dataclass(frozen=True, slots=True, kw_only=True)
class Planner:
    """The flow's PlanFn: the controller's planner (``planner_plan_fn``) over the offers, priced by
    ``OfferPricing``, memoised; its last search is kept for the Pareto artifact.  ``cheap``: the
    planner's cost search (``decide``'s ``cost_plan_fn``), which the controller asks for a job
    that minimises cost or has a deadline, and once no fast plan fits the budget left."""

    search: PlannerPlanFn
    cached: CachedPlanner
    pricing: OfferPricing
    cheap: CheapestPlanner | None = None
    caps: Mapping[tuple[str, str], int] | None = None  # most GPUs per pool, of both markets (None: no caps)
    checkpoint: CheckpointEgress | None = None  # the saves' egress each option is weighed with

    def __call__(self, available: Mapping[tuple[str, str], int]) -> tuple[PlanOption, ...]:
        return self._with_saves(self.cached(self._capped(available)))

    def _with_saves(self, options: Sequence[PlanOption]) -> tuple[PlanOption, ...]:
        if self.checkpoint is None:
            return tuple(options)
        return tuple(self.checkpoint.with_egress(o) for o in options)

    def within(self, caps: Mapping[tuple[str, str], int]) -> Planner:
        """This planner asked within ``caps``: the controller asks about spot and on-demand GPUs
        together, which would double a pool the job may rent on either market."""
        return dataclasses.replace(self, caps=dict(caps))

    @property
    def cost_plan_fn(self):
        """``decide``'s ``cost_plan_fn``: the cheapest plans, within the caps (None: not asked)."""
        return None if self.cheap is None else self._cheapest

    def _cheapest(self, available: Mapping[tuple[str, str], int], floor: float | None = None
                  ) -> tuple[PlanOption, ...]:
        return self._with_saves(self.cheap(self._capped(available), floor))

    def _capped(self, available: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        if self.caps is None:
            return dict(available)
        capped = {k: min(n, self.caps.get(k, 0)) for k, n in available.items()}
        return {k: n for k, n in capped.items() if n > 0}

    def priced(self, option: PlanOption) -> PlanOption:
        """``option`` at the price of the whole instances it is rented as, each on its market (the
        controller prices a pool moved on demand by the catalog's premium per GPU)."""
        return dataclasses.replace(option, usd_per_hr=self.pricing(option.plan))

    @property
    def last_result(self) -> Any:
        return self.search.last_result

    def option(self, plan, throughput_samples_per_s: float) -> PlanOption:
        """``plan`` at ``throughput_samples_per_s``, priced as its instances, with the simulator's egress."""
        egress = plan_egress_usd_per_hr(plan, throughput_samples_per_s, spot=self.pricing.spot)
        return self._with_saves([plan_option(plan, throughput_samples_per_s=throughput_samples_per_s,
                                             usd_per_hr=self.pricing(plan), egress_usd_per_hr=egress)])[0]

    def nodes(self, option: PlanOption) -> tuple[NodeRequest, ...]:
        return self.pricing.nodes(option.plan)


def plan_egress_usd_per_hr(plan, throughput_samples_per_s: float, *, spot: bool) -> float:
    """What ``plan``'s bytes across zones cost per hour of training at that throughput (the
    simulator's egress per iteration); a plan in one zone sends none."""
    if len({r.zone for s in plan.stages for r in s.replicas}) < 2:
        return 0.0
    sim = simulate(plan, spot=spot)
    return egress_rate_usd_per_hr(sim.egress_usd_per_iteration, throughput_samples_per_s, plan.global_batch_size)


def planner_on_offers(offers: Sequence[Offer], *, model: str, objective: Objective | str = Objective.THROUGHPUT,
                      global_batch_size: int | None = None, max_usd_per_hr: float | None = None,
                      min_throughput_samples_per_s: float | None = None, spot: bool = True) -> Planner:
    pricing = OfferPricing(offers=tuple(offers), spot=spot)
    query = PlanQuery(model=model, objective=Objective.parse(objective), global_batch_size=global_batch_size,
                      max_usd_per_hour=max_usd_per_hr, min_throughput_samples_per_s=min_throughput_samples_per_s,
                      spot=spot, search=SearchSettings(collect_pareto=True, max_tp_degree=max_tp_degree(offers)))
    search = planner_plan_fn(query, pricing=pricing, on_infeasible=_log_infeasible)
    return Planner(search=search, cached=CachedPlanner(plan_fn=search), pricing=pricing)


def max_tp_degree(offers: Sequence[Offer]) -> int:
    """The widest TP group the offers can hold (a TP group lives on one node): the planner's
    default of 8 or the largest node offered, whichever is smaller (GCP's T4 nodes hold 4).
    A plan whose group is wider than the nodes of its own zone is left out when priced."""
    return min(DEFAULT_MAX_TP_DEGREE, max((o.gpus_per_node for o in offers), default=1))


def job_planner(spec: JobSpec, offers: Sequence[Offer]) -> Planner:
    """The job's planner: its fastest plans within the caps, and its cheapest above a floor (the
    job's, or what a deadline needs), which the controller asks with the cost objective or a
    deadline, and once no fast plan finishes within the budget left; the controller ranks them
    by the job's objective."""
    planner = planner_on_offers(offers, model=spec.model, objective=FASTEST.objective,
                                global_batch_size=spec.global_batch_size, max_usd_per_hr=spec.max_usd_per_hr,
                                min_throughput_samples_per_s=spec.min_throughput_samples_per_s, spot=spec.spot)

    def cheapest_above(floor: float | None) -> PlannerPlanFn:  # the controller's floor includes the job's
        query = dataclasses.replace(planner.search.query, objective=CHEAPEST.objective,
                                    min_throughput_samples_per_s=floor,
                                    search=SearchSettings(max_tp_degree=max_tp_degree(offers)))
        return planner_plan_fn(query, pricing=planner.pricing, on_infeasible=_log_infeasible)

    return dataclasses.replace(planner, cheap=CheapestPlanner(make=cheapest_above), checkpoint=checkpoint_egress(spec))


def checkpoint_egress(spec: JobSpec) -> CheckpointEgress:
    """The job's checkpoint bucket (where its spec says: ``tasks.cloud.job_bucket_spec``) and saves."""
    return CheckpointEgress(place=bucket_place(spec.checkpoint_url, spec.checkpoint_region),
                            every_steps=spec.checkpoint_every_steps)


def _log_infeasible(exc: InfeasibleError) -> None:
    get_run_logger().warning("planner: %s", exc)


def on_demand_availability(spec: JobSpec, available: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """On-demand GPUs the controller may rent per pool: ``spec.on_demand_gpus`` of each pool the job
    may use (``available``: its caps), none for a job that rents spot only or nothing but on demand."""
    if not spec.spot or spec.on_demand_gpus <= 0:
        return {}
    return {k: min(n, spec.on_demand_gpus) for k, n in available.items() if n > 0}


def controller_state(state: js.JobState, *, available: Mapping[tuple[str, str], int],
                     current: PlanOption | None, now_unix_s: float) -> ControllerState:
    gbs = (state.plan or {}).get("global_batch_size") or state.spec.global_batch_size or 1
    deadline_h = state.spec.deadline_h
    return ControllerState(
        plan=current, available=dict(available),
        # one save's egress kept back: the save a stop makes, or the next interval's, must fit too
        budget_left_usd=state.ledger().budget_left_usd(now_unix_s) - checkpoint_egress(state.spec).reserve_usd(current),
        time_left_s=(state.created_unix_s + deadline_h * 3600.0 - now_unix_s) if deadline_h else math.inf,
        samples_done=float((state.last_checkpoint_step or 0) * gbs),
        samples_target=float(state.spec.steps * gbs),
        last_plan=current,
        # What the replay's controller sees too, so both rank plans by expected restarts: here
        # the job's own preemptions (each one took GPUs of the job: the share is left at 1).
        preemption_rate_per_s=preemption_rates_per_s(state, now_unix_s),
        on_demand_available=on_demand_availability(state.spec, available),
    )


def preemption_rates_per_s(state: js.JobState, now_unix_s: float) -> dict[tuple[str, str], float]:
    """The job's preemptions per second on each pool since its first launch (instances of one pool
    preempted at the same second are one event), each counted over at least an hour, or over the
    job's expected length when that is shorter (``rate_window_s``: a job of minutes learns from
    minutes)."""
    if not state.instances:
        return {}
    events = {(i.gpu, i.zone, i.ended_unix_s) for i in state.instances if i.end_reason == "preempted"}
    num_events: dict[tuple[str, str], int] = {}
    for gpu, zone, _ in events:
        num_events[(gpu, zone)] = num_events.get((gpu, zone), 0) + 1
    elapsed_s = now_unix_s - min(i.launched_unix_s for i in state.instances)
    window_s = rate_window_s(elapsed_s, state.steps_done / state.spec.steps if state.spec.steps else 0.0)
    return observed_preemption_rates_per_s(num_events, elapsed_s, window_s=window_s)


def controller_decision(planner: Planner, state: js.JobState, *, available: Mapping[tuple[str, str], int],
                        event: Event, current: PlanOption | None, shutdown_s: float, now_unix_s: float) -> Decision:
    """``decide`` on the job's terms: ``available`` are the job's caps per pool (spot, and on demand
    as far as ``on_demand_gpus`` allows), the planner asked within them; a mixed plan chosen is
    priced as its instances, each on its market (what the ledger will be charged)."""
    planner = planner.within(available)
    config = controller_config("ours", costs=flow_costs(state.spec), shutdown_s=shutdown_s, terms=state.spec.terms)
    decision = decide(controller_state(state, available=available, current=current, now_unix_s=now_unix_s),
                      event, config=config, plan_fn=planner, cost_plan_fn=planner.cost_plan_fn)
    if decision.plan is not None and decision.plan.on_demand and decision.plan is not current:
        decision = dataclasses.replace(decision, plan=planner.priced(decision.plan))
    return decision


def interim_plan(spec: JobSpec, offers: Sequence[Offer], next_option: PlanOption,
                 kept: Mapping[tuple[str, str], int]) -> tuple[PlanOption, tuple[NodeRequest, ...]] | None:
    """What the GPUs ``kept`` (of running instances the next plan keeps) train on while its new
    instances boot, with its nodes (``sailor_core.controller.interim``, as in the replay); None
    when nothing trains on them or it would not pay.  Searched at the next plan's batch size and
    without the job's floor or hourly cap: those GPUs are paid for meanwhile either way."""
    if not kept:
        return None
    planner = planner_on_offers(offers, model=spec.model, global_batch_size=next_option.plan.global_batch_size,
                                spot=spec.spot)
    option = interim_option(planner, kept)
    config = controller_config("ours", costs=flow_costs(spec), shutdown_s=0.0, terms=spec.terms)
    if option is None or not interim_pays(
            window_s=config.provisioning_s, rejoin_s=config.rejoin_s, load_s=0.0, save_s=0.0,
            interim_samples_per_s=option.throughput_samples_per_s,
            next_samples_per_s=next_option.throughput_samples_per_s):
        return None
    return option, planner.nodes(option)


class DecisionWarmup:
    """While an attempt trains, the controller's decision after each preemption that may come next
    (one of the attempt's spot instances taken: the survivors' pool is known before it ends) is made
    once in a background thread on ``planner``, the planner the flow asks after it: its planner
    searches are then memoised (``CachedPlanner``), and the decision after a real preemption finds
    them and is made at once, the decision that planner makes anyway (the memo answers what it
    answered on each availability, or what its answers on a larger one imply).  ``start`` once
    the attempt trains (its searches do not compete with the workers' start for the CPU); ``wait``
    before the next decision: the two never search at once (a search half made is not memoised)."""

    def __init__(self, planner: Planner | None, state: js.JobState, *, instance_ids: Sequence[str],
                 available: Mapping[tuple[str, str], int], current: PlanOption | None, shutdown_s: float) -> None:
        self._thread: threading.Thread | None = None
        self._started = False
        spot = [r.instance_id for r in state.running_instances() if r.instance_id in instance_ids and r.spot]
        if planner is None or not spot:
            return
        # the flow run's context (its logger) in the thread: an infeasible search logs a warning
        run = contextvars.copy_context().run
        self._thread = threading.Thread(target=run, args=(self._warm, planner, state, spot, dict(available),
                                                          current, shutdown_s),
                                        name="sailor-decision-warmup", daemon=True)

    def start(self) -> DecisionWarmup:
        if self._thread is not None and not self._started:
            self._started = True
            self._thread.start()
        return self

    @staticmethod
    def _warm(planner: Planner, state: js.JobState, victims: Sequence[str], available: Mapping[tuple[str, str], int],
              current: PlanOption | None, shutdown_s: float) -> None:
        for iid in victims:
            now = time.time()
            after = js.with_instances_ended(state, {iid}, "preempted", now_unix_s=now)
            event = recovery.preemption_event(after, [iid])
            try:
                controller_decision(planner, after, available=available, event=event, current=current,
                                    shutdown_s=shutdown_s, now_unix_s=now)
            except Exception as exc:  # noqa: BLE001  a warm-up only: the real decision is made (and fails) in the flow
                _log.debug("decision warm-up after a preemption of %s: %s", iid, exc)

    def wait(self) -> None:
        if self._started:
            self._thread.join()


@task(name="decide", cache_policy=NO_CACHE)  # no tags: see tasks/workers.py
def decide_next(planner: Planner, state: js.JobState, *, available: Mapping[tuple[str, str], int],
                event: Event, current: PlanOption | None, shutdown_s: float, now_unix_s: float) -> Decision:
    """The controller's decision (start, after a preemption, or on a timer), planning on ``available``."""
    decision = controller_decision(planner, state, available=available, event=event, current=current,
                                   shutdown_s=shutdown_s, now_unix_s=now_unix_s)
    get_run_logger().info("controller: %s (%s)", decision.action.value, decision.reason)
    return decision


def pareto_points(planner: Planner) -> list[tuple[float, float]]:
    result = planner.last_result
    if result is None:
        return []
    return [(p.throughput_samples_per_s, p.usd_per_iteration) for p in result.pareto]


def chosen_point(planner: Planner, option: PlanOption) -> tuple[float, float] | None:
    """(samples/s, USD/iteration) of the chosen plan, as the planner scored it (same terms as the front)."""
    result = planner.last_result
    for c in (result.candidates if result is not None else ()):
        if c.plan == option.plan:
            return (c.sim.throughput_samples_per_s, c.sim.usd_per_iteration)
    return None


@task(name="plan", tags=["planner"], cache_policy=NO_CACHE)
def plan_options(planner: Planner, available: Mapping[tuple[str, str], int]) -> list[PlanOption]:
    """The planner's ranked plans on ``available``, priced as whole instances."""
    return list(planner(available))
