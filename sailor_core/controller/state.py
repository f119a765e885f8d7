"""What the controller decides on: the job's terms (``ControllerConfig``), what it knows now
(``ControllerState``), what happened (``Event``) and what it decides (``Decision``); and the
preemption rates both the replay and the train-job flow feed it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from sailor_core.controller.economics import Costs
from sailor_core.controller.state_load import StateLoad
from sailor_core.controller.options import GpuZone, PlanOption
from sailor_core.controller.ranking import OptionRanking, option_ranking
from sailor_core.errors import InputError
from sailor_core.objective import JobTerms

_S_PER_HR = 3600.0


STRATEGIES = ("replan", "failover", "static")


class Action(str, Enum):
    CONTINUE = "continue"  # keep the current plan
    REPLAN = "replan"      # switch to ``plan`` (checkpoint, reprovision, resume)
    SHRINK = "shrink"      # switch to the cheaper ``plan`` so the budget lasts
    WAIT = "wait"          # nothing can run now: hold no instances, wait for capacity
    STOP = "stop"          # the job ends (done, budget, or nothing will ever run)


class EventKind(str, Enum):
    START = "start"
    PREEMPTION = "preemption"
    CAPACITY = "capacity"   # availability changed without taking our GPUs
    PROGRESS = "progress"
    TIMER = "timer"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: EventKind
    lost: Mapping[GpuZone, int] = field(default_factory=dict)  # our GPUs taken away
    zone_hint: str | None = None  # failover: the zone just preempted


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    strategy: str = "replan"
    gpu_types: tuple[str, ...] | None = None   # None: every type
    # The job's objective and floor (on the expected throughput, after restarts); its deadline and
    # on-demand GPUs reach the controller as ControllerState.time_left_s and on_demand_available.
    terms: JobTerms = JobTerms()
    shutdown_s: float = 120.0     # paid after deciding to stop: final checkpoint + terminate
    # The costs of change (economics.Costs): a planned switch pays save + provisioning (for
    # instances not held) + start-up; a preemption that hits the plan costs provisioning +
    # start-up + the work redone.
    save_s: float = 0.0           # checkpoint before a planned switch
    provisioning_s: float = 150.0  # new instances up
    startup_s: float = 150.0      # workers started, rendezvous, checkpoint loaded
    work_lost_s: float = 0.0      # training redone per preemption (0 when the notice covers a save)
    # A change onto GPUs all held: their workers re-form the job in place (None: a start-up)
    rejoin_s: float | None = None
    # What a change loads, by what the ranks held keep in memory (None: the whole checkpoint, in
    # start-up and rejoin above): economics.Costs.state_load
    state_load: StateLoad | None = None
    min_gain: float = 0.05        # a voluntary switch must gain this much (samples, or USD per sample)
    # A deadline must hold in most outcomes, not on average: a plan makes it when it finishes in
    # time at this quantile of its preemptions (economics.deadline_margin_s; 0.5: the mean).
    deadline_quantile: float = 0.9
    # Ask the planner about new capacity only once the GPUs beyond what the
    # current plan was chosen from reach this fraction of them (or a new pool
    # appears): small returns cannot pay for a restart, and each call costs.
    min_growth: float = 0.10
    # Also ask the planner for each GPU type alone: a plan over fewer, calmer pools
    # can finish sooner once restarts are counted (and a capped search may miss it).
    per_type_options: bool = True
    # Also ask it without the stormiest pools, one more left out each time (pools with a
    # preemption rate, by the rate at which they take a GPU held there): a plan may leave a
    # stormy pool unused on purpose.
    calm_options: bool = True

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(f"unknown controller strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.strategy == "failover" and not self.gpu_types:
            raise InputError("the failover strategy needs exactly one GPU type")
        times = (self.shutdown_s, self.save_s, self.provisioning_s, self.startup_s, self.work_lost_s,
                 self.costs.rejoin_or_startup_s)
        if min(times) < 0 or self.min_gain < 0 or self.min_growth < 0:
            raise InputError("controller times and gain must be >= 0")
        if not 0.5 <= self.deadline_quantile < 1.0:
            raise InputError(f"deadline quantile must be in [0.5, 1), got {self.deadline_quantile}")

    @property
    def ranking(self) -> OptionRanking:
        """How the objective orders the options."""
        return option_ranking(self.terms.objective)

    @property
    def costs(self) -> Costs:
        return Costs(save_s=self.save_s, provisioning_s=self.provisioning_s, startup_s=self.startup_s,
                     work_lost_s=self.work_lost_s, rejoin_s=self.rejoin_s, state_load=self.state_load)

    @property
    def change_cost_s(self) -> float:
        """Downtime of a planned switch to new instances."""
        return self.save_s + self.provisioning_s + self.startup_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerState:
    plan: PlanOption | None                 # running now (None: nothing runs)
    available: Mapping[GpuZone, int]        # spot GPUs obtainable now, counting those we hold
    budget_left_usd: float = math.inf
    time_left_s: float = math.inf           # until the job's deadline
    samples_done: float = 0.0
    samples_target: float = math.inf
    last_plan: PlanOption | None = None     # the last plan that ran (failover keeps its request)
    planned_on: Mapping[GpuZone, int] | None = None  # availability the current plan was chosen from
    # Preemption events per second seen so far on each pool (empty: unknown, treated as 0).
    preemption_rate_per_s: Mapping[GpuZone, float] = field(default_factory=dict)
    # Of each pool, the share of its GPUs one preemption event takes (empty: 1, every event hits).
    preemption_share: Mapping[GpuZone, float] = field(default_factory=dict)
    # On-demand GPUs obtainable per pool (empty: spot only); never preempted.
    on_demand_available: Mapping[GpuZone, int] = field(default_factory=dict)
    # Whose ranks hold the training state when not ``plan``'s: during a change, the interim that
    # trains while new instances boot, or the last plan that trained while ``plan`` starts (None:
    # ``plan``'s).  A change's load is from them (``state_load``), as the replay charges it.
    state_holder: PlanOption | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    reason: str
    plan: PlanOption | None = None  # what runs after this decision
    stop_in_s: float = math.inf     # ask again (TIMER) at the latest after this long
    planned_on: Mapping[GpuZone, int] | None = None  # keep it for the next ControllerState
    declined: PlanOption | None = None  # CONTINUE: a plan that ranked better, left alone (``reason`` says why)
    why: str = ""  # the economics of the choice (or of the switch declined) in plain words, for people

    @property
    def changes_plan(self) -> bool:
        return self.action in (Action.REPLAN, Action.SHRINK)


# One event alone must not read as a storm: a rate is counted over at least this long.
RATE_WINDOW_S = _S_PER_HR


def observed_preemption_rates_per_s(num_events: Mapping[GpuZone, int], observed_s: float, *,
                                    window_s: float = RATE_WINDOW_S) -> dict[GpuZone, float]:
    """Preemption events per second on each pool from what was seen so far, for
    ``ControllerState.preemption_rate_per_s``: at least ``window_s`` (an hour, or
    ``rate_window_s``) in the denominator, so the first event does not read as a storm.
    The replay and the train-job flow both use it."""
    return {k: n / max(observed_s, window_s) for k, n in num_events.items() if n > 0}


def rate_window_s(elapsed_s: float, fraction_done: float) -> float:
    """The least time a rate is counted over: an hour, or the job's expected length when that is
    shorter (elapsed / fraction done): what matters is how often a pool stops the job relative to
    the job itself, and a job of minutes learns from minutes."""
    if fraction_done <= 0 or elapsed_s <= 0:
        return RATE_WINDOW_S
    return min(RATE_WINDOW_S, elapsed_s / min(1.0, fraction_done))

