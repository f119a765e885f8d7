"""The controller's decisions: what to do when capacity, progress or time changes.

``decide(state, event, config=..., plan_fn=...)`` is pure: the train-job flow
and the replay both call it and carry out its Decision (launch the new plan,
keep going, release everything and wait, or stop).  Three strategies:

* ``replan`` (Sailor): re-plan over every allowed GPU type and zone whenever the plan
  is broken, the capacity grew, or the plan in use no longer meets the job's
  constraints; the job's objective ranks the options by their expected time or cost
  to finish under each pool's preemption rate (``economics``), and a running plan is
  left only when the switch pays for itself before the next preemption would force a
  re-plan anyway (with ``gpu_types`` set this is "our planner restricted to one GPU type");
* ``failover`` (SkyPilot-style managed job): one fixed GPU request in one zone;
  on preemption restart it in the next cheapest zone with room for it, never
  resized;
* ``static``: the plan chosen at the start; after a loss it re-plans on the GPUs
  it still holds and never grows back.

The job's objective and constraints (``ControllerConfig.terms``: the objective, ranked as
``ranking.OPTION_RANKINGS`` says, and the throughput
floor, ``ControllerState.budget_left_usd`` and ``time_left_s``): ``throughput`` finishes
soonest, ``cost`` for the fewest USD; options that would cross the budget, miss the
deadline or fall below the floor give way to those that do not (when none meets the
deadline or the floor, the fastest runs).  Budget: if no option finishes within it, the
one that trains the most per USD runs until ``stop_in_s``, when the caller must ask again
and gets ``stop`` -- before the budget would be crossed, with the shutdown still to pay
set aside.

Every decision says why in plain words (``Decision.reason``), a declined switch too
(``Decision.declined``: the better plan left alone, and why).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sailor_core.controller.candidates import candidates, planner_requests, within_budget
from sailor_core.controller.economics import (
    Outlook,
    change_s,
    change_usd,
    deadline_margin_s,
    outlook,
    regrow_shortfall,
    switch_window,
)
from sailor_core.controller.options import CostPlanFn, GpuZone, PlanFn, PlanOption, describe_gpus, restrict
from sailor_core.controller.ranking import CHEAPEST, SOONEST, switch_pays
from sailor_core.controller.reasons import (
    deadline_words,
    explain,
    figures,
    gpus_words,
    per_hour,
    plain_versus,
    versus,
    why_words,
)
from sailor_core.controller.state import (
    Action,
    ControllerConfig,
    ControllerState,
    Decision,
    Event,
    EventKind,
)

_S_PER_HR = 3600.0


def decide(state: ControllerState, event: Event, *, config: ControllerConfig, plan_fn: PlanFn,
           cost_plan_fn: CostPlanFn | None = None) -> Decision:
    """The controller's decision on ``event``; ``plan_fn`` is the planner (its best plans on an
    availability, best first).  ``cost_plan_fn``, when given, is the planner's cheapest plans
    above a throughput floor: with the cost objective (above its floor) or a deadline (above
    what finishing in time needs) they join the options on the whole availability."""
    remaining = max(0.0, state.samples_target - state.samples_done)
    if remaining <= 0:
        return Decision(action=Action.STOP, reason="done: target reached")
    current = state.plan
    lost = {k: n for k, n in event.lost.items() if n > 0 and current is not None and current.gpus.get(k, 0) > 0}
    broken = current is not None and (bool(lost) or not current.fits_in(state.available, state.on_demand_available))
    if current is not None and not broken:
        deadline = _stop_in_s(current, state, config)
        if deadline <= 1e-3:  # seconds; rounding must not keep a spent job alive
            return Decision(action=Action.STOP, reason="budget: only the shutdown is left to pay")
    elif state.budget_left_usd <= 0:
        return Decision(action=Action.STOP, reason="budget: spent")

    if config.strategy == "failover":
        return _decide_failover(state, event, lost, broken, config, plan_fn, remaining)
    if config.strategy == "static":
        return _decide_static(state, event, lost, broken, config, plan_fn, remaining)
    return _decide_replan(state, event, lost, broken, config, plan_fn, cost_plan_fn, remaining)


# ---- the job's objective over the options ---------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ranking:
    """Options' outlooks seen from one state: what still trains (``running``: a switch saves
    it first and it needs no change itself) and what is held (no provisioning needed)."""

    state: ControllerState
    config: ControllerConfig
    remaining: float
    running: PlanOption | None
    held: Mapping[GpuZone, int]
    held_on_demand: Mapping[GpuZone, int]
    # whose ranks hold the state: the plan in use, even broken, unless a change under way left it
    # elsewhere (ControllerState.state_holder)
    holder: PlanOption | None = None
    lost: Mapping[GpuZone, int] = dataclasses.field(default_factory=dict)  # its GPUs just taken

    def of(self, option: PlanOption) -> Outlook:
        change = change_s(option, running=self.running, held=self.held, held_on_demand=self.held_on_demand,
                          costs=self.config.costs, holder=self.holder, lost=self.lost)
        usd = change_usd(option, running=self.running, costs=self.config.costs, holder=self.holder, lost=self.lost,
                         restores=self.state.samples_done > 0)  # (a first start has no checkpoint to read)
        return outlook(option, remaining=self.remaining, change=change, rates=self.state.preemption_rate_per_s,
                       shares=self.state.preemption_share, costs=self.config.costs, change_usd=usd)

    def finishes(self, o: Outlook) -> bool:
        """Within the budget left: the expected cost to finish (the loads' egress included: handovers
        and restores), then the shutdown."""
        if math.isinf(self.state.budget_left_usd):
            return True
        need = o.option.usd_for(o.time_s + self.config.shutdown_s, o.training_s) + o.load_egress_usd
        return need <= self.state.budget_left_usd

    def in_time(self, o: Outlook) -> bool:
        """Finishes by the deadline at the configured quantile of its preemptions, not just on average."""
        return o.time_s + self.margin_s(o) <= self.state.time_left_s

    def margin_s(self, o: Outlook) -> float:
        """What the deadline asks beyond ``o``'s expected time (0 without a deadline)."""
        if math.isinf(self.state.time_left_s):
            return 0.0
        return deadline_margin_s(o, quantile=self.config.deadline_quantile, costs=self.config.costs)

    def above_floor(self, o: Outlook) -> bool:
        floor = self.config.terms.min_throughput_samples_per_s
        return floor is None or o.effective_samples_per_s >= floor

    def holds(self, o: Outlook) -> bool:
        """Every constraint: budget, deadline, floor."""
        return self.finishes(o) and self.in_time(o) and self.above_floor(o)

    def near_best(self, options: Sequence[Outlook]) -> Outlook:
        """The objective's pick of ``options`` (all keeping the constraints).  Plans within
        ``min_gain`` of the best in the ranking's own figure are alike as far as the controller
        can tell (it would not switch for less).  Finishing soonest, one of them that sends less
        across zones than the soonest runs instead when it costs less (rent plus egress): a plan
        that spans zones for a sliver of speed would pay its egress for nothing.  "Within" counts
        the effective throughput too: near the end of a job the time is mostly the change, and
        half the GPUs would look as soon.  By cost with a deadline, the soonest of them: slack
        against the capacity it cannot foresee, for next to nothing.  By cost with no deadline,
        the cheapest."""
        best = min(options, key=self.config.ranking.key)
        slack = 1.0 + self.config.min_gain
        if not self.config.ranking.by_cost:
            less_egress = [o for o in options if o.option.egress_usd_per_hr < best.option.egress_usd_per_hr
                           and o.time_s <= best.time_s * slack
                           and o.effective_samples_per_s * slack >= best.effective_samples_per_s]
            return min([best, *less_egress], key=lambda o: (o.cost_usd, o.time_s))
        if math.isfinite(self.state.time_left_s):
            near = [o for o in options if o.cost_usd <= best.cost_usd * slack]
            return min(near, key=lambda o: (o.time_s, o.cost_usd))
        return best

    def best(self, outlooks: Sequence[Outlook]) -> tuple[Outlook | None, str]:
        """The option the objective picks among those that finish within the budget, and the
        constraint it had to give up ("" when none).  None when none finishes within it."""
        within = [o for o in outlooks if o.effective_samples_per_s > 0 and self.finishes(o)]
        if not within:
            return None, ""
        in_time = [o for o in within if self.in_time(o)]
        floor_ok = [o for o in in_time if self.above_floor(o)]
        if floor_ok:
            return self.near_best(floor_ok), ""
        why = ("no plan finishes by the deadline" if not in_time
               else "no plan keeps the throughput floor")
        return min(within, key=lambda o: (o.time_s, o.cost_usd)), f"{why}; the fastest runs"


def _ranking(state: ControllerState, config: ControllerConfig, remaining: float, *,
             lost: Mapping[GpuZone, int], broken: bool) -> _Ranking:
    current = state.plan
    held = {k: n - lost.get(k, 0) for k, n in current.gpus.items()} if current is not None else {}
    return _Ranking(state=state, config=config, remaining=remaining,
                    running=current if current is not None and not broken else None,
                    held={k: n for k, n in held.items() if n > 0},
                    held_on_demand=dict(current.on_demand) if current is not None else {},
                    holder=state.state_holder or current, lost=dict(lost))


# ---- strategies ---------------------------------------------------------------


def _decide_replan(state, event, lost, broken, config, plan_fn, cost_plan_fn, remaining) -> Decision:
    current = state.plan
    avail = restrict(state.available, config.gpu_types)
    rank = _ranking(state, config, remaining, lost=lost, broken=broken)
    now = rank.of(current) if current is not None and not broken else None
    ask = avail
    if now is not None and not grew(avail, state.planned_on, config.min_growth):
        if rank.holds(now):
            return _keep(current, state, config)
        # The plan in use no longer keeps a constraint, yet nothing grew: the options are those it
        # was chosen from (answers the planner has), ranked again on what is known now.
        ask = dict(state.planned_on)
    useful = rank.of(current).useful_fraction if current is not None else 1.0
    outlooks = [rank.of(o) for o in candidates(ask, state, config, plan_fn, cost_plan_fn, useful=useful)
                if o.fits_in(state.available, state.on_demand_available)]
    outlooks = [o for o in outlooks if _affordable_at_all(o.option, state, config)]
    over_budget = None  # the fastest plan offered, when none of the fast plans fits the budget
    if cost_plan_fn is not None and math.isfinite(state.budget_left_usd) and outlooks \
            and not any(rank.finishes(o) for o in outlooks):
        over_budget = min(outlooks, key=lambda o: (o.time_s, o.cost_usd))
        outlooks += _budget_outlooks(ask, outlooks, rank, cost_plan_fn)
    if now is None:
        why = _why_new(current, lost, event)
        choice, gave_up = rank.best(outlooks)
        if choice is None:
            choice = _most_per_usd(outlooks)
            if choice is None:
                return _nothing_runs(why, outlooks, state, config)
            gave_up = "no plan finishes within the budget; the one training the most per USD runs"
        offered = planner_requests(avail, state, config)[0]
        kept = _held_unless_renting_pays(choice, rank, plan_fn) if lost and not gave_up else None
        if kept is not None:
            held, reason, words = kept
            return _run(Action.REPLAN, f"{why}: {explain(held, offered, state, '')}; {reason}",
                        held.option, state, config, planned_on=avail,
                        why="; ".join(w for w in (why_words(held, offered, state, ""), words) if w))
        note, words = _over_budget_words(over_budget, choice, state) if not gave_up else ("", "")
        reason = f"{why}: {explain(choice, offered, state, gave_up)}{_deadline_note(choice, rank)}{note}"
        return _run(Action.REPLAN, reason, choice.option, state, config, planned_on=avail,
                    why="; ".join(w for w in (why_words(choice, offered, state, gave_up), words) if w))
    return _switch_or_keep(now, outlooks, rank, avail=avail, ask=ask)


def _over_budget_words(fastest: Outlook | None, choice: Outlook, state: ControllerState) -> tuple[str, str]:
    """Why ``choice`` is not the fastest plan offered (``fastest``) when that one would overrun
    the budget left: a note for the reason and words for people; ("", "") otherwise."""
    if fastest is None or _same(fastest.option, choice.option):
        return "", ""
    left = f"{state.budget_left_usd:,.2f} USD"
    return (f"; the fastest plan ({fastest.option.label}, {figures(fastest)}) would overrun the {left} left",
            f"the fastest plan would cost {fastest.cost_usd:,.2f} USD to finish, more than the {left} left, "
            f"so the fastest one within the budget runs")


def _budget_outlooks(ask: Mapping[GpuZone, int], outlooks: Sequence[Outlook], rank: _Ranking,
                     cost_plan_fn: CostPlanFn) -> list[Outlook]:
    """None of ``outlooks`` finishes within the budget left: the cheapest plans, searched for the
    fastest that does (``within_budget``)."""
    state, config = rank.state, rank.config
    found = within_budget(ask, state, config, cost_plan_fn,
                          finishes=lambda o: rank.finishes(rank.of(o)),
                          fastest_samples_per_s=max(o.option.throughput_samples_per_s for o in outlooks))
    return [rank.of(o) for o in found if o.fits_in(state.available, state.on_demand_available)
            and _affordable_at_all(o, state, config)]


def _switch_or_keep(now: Outlook, outlooks: Sequence[Outlook], rank: _Ranking, *,
                    avail: Mapping[GpuZone, int], ask: Mapping[GpuZone, int]) -> Decision:
    """The running plan (``now``) against the options: a switch to keep a constraint it no longer
    keeps, a switch that pays for itself, or the plan kept (with the better plan declined)."""
    state, config, current = rank.state, rank.config, now.option
    choice, gave_up = rank.best([now, *outlooks])
    ranking = config.ranking
    if choice is None:  # none finishes within the budget: the most per USD, as long as it lasts
        choice, ranking = _most_per_usd([now, *outlooks]), CHEAPEST
    elif math.isfinite(state.time_left_s) and not rank.in_time(choice):
        ranking = SOONEST  # none makes the deadline: the fastest runs, so a switch must save time
    if choice is None or _same(choice.option, current):
        return _keep(current, state, config, planned_on=ask)
    if not rank.holds(now) and rank.holds(choice):
        what = ("budget" if not rank.finishes(now) else "deadline" if not rank.in_time(now) else "throughput floor")
        action = Action.SHRINK if what == "budget" else Action.REPLAN
        offered = planner_requests(avail, state, config)[0]
        late = ""
        if what == "deadline":  # the figures that made it give way, and the new plan's against them
            late = (f"the plan in use {deadline_words(now, rank.margin_s(now), state, config)}; the new one "
                    f"{deadline_words(choice, rank.margin_s(choice), state, config)}; ")
        return _run(action, f"{what}: {late}switch to a plan that keeps it: {explain(choice, offered, state, '')}",
                    choice.option, state, config, planned_on=ask,
                    why=f"the plan in use would not keep the {what}"
                        + (f" (it {deadline_words(now, rank.margin_s(now), state, config)})" if late else "")
                        + (f"; {w}" if (w := why_words(choice, offered, state, "")) else ""))
    if switch_pays(now, choice, ranking=ranking, remaining=rank.remaining, min_gain=config.min_gain):
        return _run(Action.REPLAN, f"{gave_up or 'capacity'}: {choice.option.label} {versus(choice, now)}",
                    choice.option, state, config, planned_on=ask,
                    why=f"switched to a better plan: {plain_versus(choice, now, ranking)}")
    tau, until = switch_window(now, choice)
    return _keep(current, state, config, planned_on=ask, declined=choice,
                 reason=f"declined {choice.option.label}: {versus(choice, now)}, but the switch "
                        f"({choice.change_s:.0f} s) does not pay for itself within {tau / 60:.0f} min "
                        f"(until {until}, expected then)",
                 why=f"kept the plan rather than move to {gpus_words(choice.option.all_gpus())}: "
                     f"{plain_versus(choice, now, ranking)}, but the {choice.change_s:.0f} s change would not "
                     f"pay for itself before {until}")


def _deadline_note(o: Outlook, rank: _Ranking) -> str:
    """With a deadline: when ``o`` finishes at the deadline's quantile, against the time left."""
    if math.isinf(rank.state.time_left_s):
        return ""
    return f"; by the deadline: {deadline_words(o, rank.margin_s(o), rank.state, rank.config)}"


def _held_unless_renting_pays(choice: Outlook, rank: _Ranking, plan_fn: PlanFn) -> tuple[Outlook, str, str] | None:
    """Finishing soonest or by a deadline, after a preemption: the best plan on the spot GPUs
    still held (with the reason in figures and in words) instead of ``choice``, when ``choice``
    needs new instances that do not pay yet.  The restart comes either way; what it decides is
    whether to wait for instances that a stormy pool will likely take again soon.  They pay once
    the plan on what is held falls short of ``choice`` by ``regrow_shortfall`` (replacements
    rented in batches, not after every hit; by a deadline only while the held plan still makes
    it).  Finishing cheapest with no deadline, the ranking's own choice runs: a plan on fewer GPUs
    is mostly cheaper per sample, so waiting for the shortfall to grow would shrink the job to
    nothing.  None: run ``choice``."""
    held = {k: min(n, rank.state.available.get(k, 0)) for k, n in rank.held.items()}
    held = {k: n for k, n in held.items() if n > 0}
    cheapest_at_any_time = rank.config.ranking.by_cost and math.isinf(rank.state.time_left_s)
    if cheapest_at_any_time or not held or rank.held_on_demand or choice.option.fits_in(held):
        return None  # cheapest, nothing held, a mixed plan (its markets are the candidates' job), or no rent
    options = [rank.of(o) for o in plan_fn(held) if o.fits_in(held) and not o.on_demand]
    alt, gave_up = rank.best(options)
    if alt is None or gave_up:
        return None
    short = 1.0 - alt.effective_samples_per_s / choice.effective_samples_per_s
    enough = regrow_shortfall(choice, alt, rates=rank.state.preemption_rate_per_s, shares=rank.state.preemption_share)
    if short >= enough:
        return None
    extra_s = choice.change_s - alt.change_s
    more = describe_gpus({k: n - alt.option.gpus.get(k, 0) for k, n in choice.option.gpus.items()
                          if n > alt.option.gpus.get(k, 0)})
    return (alt, f"not renting {more} for {choice.option.label} ({versus(choice, alt)}): the plan on the GPUs "
                 f"held is {short:.0%} slower, and at {choice.hits_per_s * _S_PER_HR:.1f} preemptions/h new "
                 f"instances pay from {enough:.0%}",
            f"restarted on the GPUs still held rather than wait for {more}: the plan on them is only {short:.0%} "
            f"slower and, preempted {per_hour(choice.hits_per_s)}, the {extra_s:.0f} s of new instances pay "
            f"only from {enough:.0%} short (they are rented in batches)")


def _decide_failover(state, event, lost, broken, config, plan_fn, remaining) -> Decision:
    current = state.plan
    if current is not None and not broken:
        return _keep(current, state, config)
    gpu = config.gpu_types[0]
    request = state.last_plan
    avail = restrict(state.available, (gpu,))
    zones = sorted({z for (_, z) in avail})
    if request is None:  # first launch: the best single-zone plan of this GPU type
        candidates = [o for z in zones for o in plan_fn({(gpu, z): avail[(gpu, z)]})[:1]]
        choice = _choose(sorted(candidates, key=lambda o: -o.throughput_samples_per_s), state, config, remaining)
        if choice is None:
            return _nothing_runs("start", [], state, config, options=candidates)
        return _run(Action.REPLAN, f"start: {choice.label}", choice, state, config)
    # Same request, moved: cheapest zone with room first, the zone just lost last.
    size = request.num_gpus
    lost_zone = event.zone_hint or (next(iter(lost))[1] if lost else None)
    moved = []
    for z in zones:
        if avail.get((gpu, z), 0) >= size:
            opts = plan_fn({(gpu, z): size})
            if opts:
                moved.append(opts[0])
    moved.sort(key=lambda o: (next(iter(o.gpus))[1] == lost_zone, o.cost_usd_per_hr))
    why = _why_new(current, lost, event)
    if not moved:
        return Decision(action=Action.WAIT, reason=f"{why}: no zone has {size}x{gpu} free; waiting")
    choice = moved[0]
    if not _affordable_at_all(choice, state, config):
        return Decision(action=Action.STOP, reason="budget: not enough left to restart")
    return _run(Action.REPLAN, f"{why}: restart {choice.label}", choice, state, config)


def _decide_static(state, event, lost, broken, config, plan_fn, remaining) -> Decision:
    current = state.plan
    if current is None and state.last_plan is None:
        return _decide_replan(state, event, lost, broken, config, plan_fn, None, remaining)
    if current is None:
        return Decision(action=Action.STOP, reason="static: the plan lost all its GPUs and never grows back")
    if not broken:
        return _keep(current, state, config)
    held = {k: min(n - lost.get(k, 0), state.available.get(k, 0)) for k, n in current.gpus.items()}
    held = {k: n for k, n in held.items() if n > 0}
    options = plan_fn(held) if held else ()
    choice = _choose(options, state, config, remaining)
    why = _why_new(current, lost, event)
    if choice is None:
        return Decision(action=Action.STOP,
                        reason=f"static: {why}; the GPUs left run no plan and a static plan never grows back")
    return _run(Action.REPLAN, f"{why}: shrink to {choice.label}", choice, state, config)


# ---- helpers --------------------------------------------------------------------


def _time_to_finish_s(option: PlanOption, remaining: float) -> float:
    x = option.throughput_samples_per_s
    return remaining / x if x > 0 else math.inf


def _finishes(option: PlanOption, state: ControllerState, config: ControllerConfig, remaining: float) -> bool:
    """Without preemptions: a change, the work, then the shutdown, within the budget left."""
    if math.isinf(state.budget_left_usd):
        return True
    training_s = _time_to_finish_s(option, remaining)
    need_s = config.change_cost_s + training_s + config.shutdown_s
    return option.usd_for(need_s, training_s) <= state.budget_left_usd


def _affordable_at_all(option: PlanOption, state: ControllerState, config: ControllerConfig) -> bool:
    """Can it run long enough to get past its start-up and still pay its shutdown?"""
    if math.isinf(state.budget_left_usd):
        return True
    return option.usd_per_hr * (config.change_cost_s + config.shutdown_s) / _S_PER_HR < state.budget_left_usd


def _choose(options, state: ControllerState, config: ControllerConfig, remaining: float) -> PlanOption | None:
    """The failover and static strategies: the planner's best that finishes within budget; else
    the most samples per USD."""
    usable = [o for o in options if o.throughput_samples_per_s > 0 and _affordable_at_all(o, state, config)]
    if not usable:
        return None
    for o in usable:
        if _finishes(o, state, config, remaining):
            return o
    return max(usable, key=lambda o: o.samples_per_usd())


def _most_per_usd(outlooks: Sequence[Outlook]) -> Outlook | None:
    usable = [o for o in outlooks if o.effective_samples_per_s > 0]
    if not usable:
        return None
    return max(usable, key=lambda o: o.effective_samples_per_s / o.option.cost_usd_per_hr
               if o.option.cost_usd_per_hr > 0 else math.inf)


def _stop_in_s(option: PlanOption, state: ControllerState, config: ControllerConfig) -> float:
    """How long ``option`` can train before only its shutdown (rent, no egress) is left to pay."""
    if math.isinf(state.budget_left_usd) or option.cost_usd_per_hr <= 0:
        return math.inf
    if option.egress_usd_per_hr <= 0:
        return state.budget_left_usd * _S_PER_HR / option.usd_per_hr - config.shutdown_s
    return (state.budget_left_usd * _S_PER_HR - option.usd_per_hr * config.shutdown_s) / option.cost_usd_per_hr


def grew(avail: Mapping[GpuZone, int], planned_on: Mapping[GpuZone, int] | None, min_growth: float) -> bool:
    """Whether ``avail`` has grown enough past the availability the plan in use was made on to re-plan
    (a new pool, or ``min_growth`` more GPUs); the replay's lookahead asks the same question."""
    if planned_on is None:
        return True
    extra = sum(max(0, n - planned_on.get(k, 0)) for k, n in avail.items())
    if any(n > 0 and planned_on.get(k, 0) == 0 for k, n in avail.items()):
        return True
    return extra > 0 and extra >= min_growth * sum(planned_on.values())


def _run(action: Action, reason: str, option: PlanOption, state, config, planned_on=None, why: str = "") -> Decision:
    return Decision(action=action, reason=reason, plan=option, stop_in_s=_stop_in_s(option, state, config),
                    planned_on=planned_on, why=why)


def _keep(current: PlanOption, state, config, planned_on=None, declined: Outlook | None = None,
          reason: str = "no better plan", why: str = "") -> Decision:
    return Decision(action=Action.CONTINUE, reason=reason, plan=current,
                    stop_in_s=_stop_in_s(current, state, config),
                    planned_on=planned_on if planned_on is not None else state.planned_on,
                    declined=declined.option if declined is not None else None, why=why)


def _nothing_runs(why: str, outlooks, state, config, options=()) -> Decision:
    options = list(options) or [o.option for o in outlooks]
    if options and not any(_affordable_at_all(o, state, config) for o in options):
        return Decision(action=Action.STOP, reason="budget: not enough left to start any plan")
    return Decision(action=Action.WAIT, reason=f"{why}: no plan fits the GPUs available; waiting for capacity")


def _same(a: PlanOption, b: PlanOption) -> bool:
    return dict(a.gpus) == dict(b.gpus) and dict(a.on_demand) == dict(b.on_demand)


def _why_new(current: PlanOption | None, lost: Mapping[GpuZone, int], event: Event) -> str:
    if current is None:
        return "start" if event.kind == EventKind.START else "capacity returned"
    if lost:
        return "preemption: lost " + describe_gpus(lost)
    return "capacity: the plan no longer fits"
