"""What a plan is expected to cost to finish the job, in time and USD, on capacity that is preempted.

One model behind every decision of the controller (``policy.decide``), with few parameters,
each with a meaning (``ControllerConfig``, ``ControllerState``):

* **Hits.** Pool k's preemption events arrive at the rate seen so far, lambda_k per second.
  An event takes a share p_k of the pool's GPUs (``preemption_share``: the mean GPUs an
  event takes over the pool's size; 1 when unknown), so of the u_k spot GPUs a plan holds
  there it takes at least one with probability min(1, u_k p_k) (the expected share of a
  random pick).  The plan is hit at H = sum_k lambda_k min(1, u_k p_k) per second.
  On-demand GPUs are never taken.
* **Cost of a hit.** Each hit stops training for ``restart_s`` (new instances, start-up,
  checkpoint load) and redoes ``work_lost_s`` of training (0 where the notice covers a save).
  With parked workers the survivors train on an interim plan while the replacements boot
  (``controller/interim.py``), so a hit that takes a share q of the plan's GPUs idles the
  plan for the survivors' rejoin, q of the provisioning, the save and the start-up
  (``Costs.hit_s_at``; never more than the plain restart).
* **Effective throughput.** Over a long run a share 1 / (1 + H D) of the time trains, D the
  cost of a hit: X = x / (1 + H D).
* **Time and cost to finish** ``W`` remaining samples: T = change + W / X, where change is the
  downtime of getting there (0 for the plan running, else a save if something runs, then
  provisioning and start-up if it needs instances not held, else a rejoin of the workers held,
  which keep their processes; and the reload); C = rent/h x T + egress/h x the training in it
  (W / x and the work the hits redo: no bytes cross zones while the plan starts or restarts)
  + the egress of the state loaded, at the change and at each hit it expects: handed over across
  zones, and read from a checkpoint bucket outside the readers' regions once there is a
  checkpoint (``StateLoad.load_usd``, what the replay and the ledger charge too).

* **Finishing by a deadline.** T is what the plan takes on average; a deadline must hold in
  most outcomes, not half of them.  Over its W / x of training the plan is hit N times, N a
  Poisson count of mean m = H W / x, so it finishes z sqrt(m) hit_s later than T at the
  quantile q of N (``deadline_margin_s``, z the standard normal's q-quantile): a margin that is
  large far from the deadline and shrinks as the work left does.

The objective (``throughput``: least T; ``cost``: least C) ranks the options that meet the
constraints: the budget (C plus the shutdown within what is left), the deadline (T plus its
margin within the time left) and the throughput floor (X at least it).  A switch away from a plan that
still runs must pay for itself before the next preemption of either plan forces a re-plan
anyway (``ranking.switch_pays``): that is the hysteresis that keeps a stormy pool from restarting
the job every few minutes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from sailor_core.controller.options import GpuZone, PlanOption
from sailor_core.controller.state_load import StateLoad
from sailor_core.network.storage_egress import BucketPlace

_S_PER_HR = 3600.0
# The train-job flow's costs: seconds a plan change costs before training resumes (boot, torch
# import, rendezvous; measured on small models: the job's own reload is added to it and to the
# rejoin per job, ``job_costs``) ...
CHANGE_COST_S = 30.0
# ... and a change onto instances all held, whose parked workers rejoin in place (no boot, no
# import; benchmarks/bench_rejoin.py: about a tenth of a new process's start here).
REJOIN_COST_S = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """The controller's costs of change (``ControllerConfig`` holds them)."""

    save_s: float         # checkpoint before a planned switch
    provisioning_s: float  # new instances
    # From new instances running to training: their workers' start-up (with standby workers,
    # started at boot and parked, a handover like a rejoin: the replay's
    # ChangeCosts.new_instance_start_s), the rendezvous and the checkpoint load
    startup_s: float
    work_lost_s: float    # training redone per preemption
    rejoin_s: float | None = None  # the workers held re-form in place and reload (None: a start-up)
    # The load of a change by what the ranks held keep (``state_load``): start-up and rejoin
    # above include the whole checkpoint's load from storage, ``state_load.storage_load_s``,
    # which then gives way to the plans' own.  None: every change reloads the checkpoint.
    state_load: StateLoad | None = None

    def load_instead_s(self, load_s: float) -> float:
        """What a change's time gains (negative) or adds when its load is ``load_s`` rather than
        the checkpoint's from storage that the start-up and rejoin include."""
        return 0.0 if self.state_load is None else load_s - self.state_load.storage_load_s

    @property
    def rejoin_or_startup_s(self) -> float:
        return self.startup_s if self.rejoin_s is None else self.rejoin_s

    @property
    def restart_s(self) -> float:
        """Downtime of a preemption that hits the plan: new instances, start-up, reload."""
        return self.provisioning_s + self.startup_s

    @property
    def hit_s(self) -> float:
        """Training time a hit costs: the restart and the work redone."""
        return self.restart_s + self.work_lost_s

    def hit_s_at(self, share: float, plan: Any = None) -> float:
        """Training time a hit that takes ``share`` of the plan's GPUs costs.  With parked workers
        (``rejoin_s`` set) the survivors train on an interim plan while the replacements boot
        (``controller/interim.py``): the provisioning idles only the share taken, and the hit
        costs the survivors' rejoin, the save before the switch and the start-up after it;
        never more than the plain restart (then no interim runs).  With ``state_load``, the
        loads are those of a hit on ``plan`` (``StateLoad.hit_load_s``)."""
        extra = self.load_instead_s(self.state_load.hit_load_s(plan)) if self.state_load is not None else 0.0
        if self.rejoin_s is None or share >= 1.0:
            return self.hit_s + extra
        interim_s = self.rejoin_s + self.save_s + share * self.provisioning_s + self.startup_s
        return min(self.restart_s + extra, interim_s + 2 * extra) + self.work_lost_s


def job_costs(model: str, bucket: BucketPlace | None = None) -> Costs:
    """The train-job flow's costs of change for a job of ``model`` (``tasks.control.flow_costs``),
    and the start-up the check before renting charges (``job/prerent.check_reach``: its
    ``restart_s``): half of ``CHANGE_COST_S`` provisioning, half start-up, ``REJOIN_COST_S`` a
    rejoin, each plus the job's whole checkpoint from storage (``StateLoad.of_checkpoint``, at
    the default storage bandwidth: the job records no timing of its own saves or loads), which a
    change's ``state_load`` replaces with what its ranks must receive (and whose reads from
    ``bucket``, the job's checkpoint bucket, it prices where it lies far).  The constants were
    measured on the embedded cloud's small models, whose reload is negligible, so the load is
    added, not taken out of them (as the replay's ``controller_costs``)."""
    load = StateLoad.of_checkpoint(model, bucket=bucket)
    return Costs(save_s=0.0, provisioning_s=CHANGE_COST_S / 2, startup_s=CHANGE_COST_S / 2 + load.storage_load_s,
                 work_lost_s=0.0, rejoin_s=REJOIN_COST_S + load.storage_load_s, state_load=load)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outlook:
    """An option's expected figures to the end of the job."""

    option: PlanOption
    hits_per_s: float                # preemptions expected to take GPUs of the plan
    effective_samples_per_s: float   # throughput after the restarts and the work redone
    change_s: float                  # downtime before it trains (0: it runs now)
    hit_s: float                     # training time each hit costs (Costs.hit_s_at its share)
    time_s: float                    # expected time to finish, the change included
    cost_usd: float                  # expected USD to finish
    # of time_s, what it trains: the work left at its throughput and the work its hits redo; the
    # change and the hits' restarts pay the rent but no egress (nothing trains: as the ledger and
    # the replay charge it)
    training_s: float = math.inf
    # of cost_usd, the egress of the state loaded (handed over across zones, restored from a far
    # bucket): at the change and at the hits expected over the training (``StateLoad.load_usd``)
    load_egress_usd: float = 0.0

    @property
    def useful_fraction(self) -> float:
        x = self.option.throughput_samples_per_s
        return self.effective_samples_per_s / x if x > 0 else 0.0

    @property
    def expected_hits(self) -> float:
        """Preemptions expected to hit the plan before the job ends: its rate over its training
        time (W / x, the restarts left out)."""
        train_s = (self.time_s - self.change_s) * self.useful_fraction
        if self.hits_per_s <= 0:
            return 0.0
        return self.hits_per_s * train_s if math.isfinite(train_s) else math.inf


def hits_per_s(option: PlanOption, *, rates: Mapping[GpuZone, float], shares: Mapping[GpuZone, float]) -> float:
    """Preemptions per second expected to take at least one of ``option``'s spot GPUs."""
    total = 0.0
    for k, u in sorted(option.gpus.items()):
        rate = rates.get(k, 0.0)
        if u > 0 and rate > 0:
            total += rate * min(1.0, u * shares.get(k, 1.0))
    return total


def share_per_hit(option: PlanOption, *, rates: Mapping[GpuZone, float], shares: Mapping[GpuZone, float]) -> float:
    """The expected share of ``option``'s spot GPUs one hit takes (1 without hits or spot GPUs)."""
    h = hits_per_s(option, rates=rates, shares=shares)
    gpus = option.num_gpus - sum(option.on_demand.values())
    if h <= 0 or gpus <= 0:
        return 1.0
    taken_per_s = sum(rates.get(k, 0.0) * u * shares.get(k, 1.0) for k, u in option.gpus.items() if u > 0)
    return min(1.0, taken_per_s / h / gpus)


def change_s(option: PlanOption, *, running: PlanOption | None, held: Mapping[GpuZone, int],
             held_on_demand: Mapping[GpuZone, int], costs: Costs, holder: PlanOption | None = None,
             lost: Mapping[GpuZone, int] | None = None) -> float:
    """Downtime to get from what runs (``running``, None if nothing does) to ``option``, holding
    ``held`` spot and ``held_on_demand`` GPUs: nothing if it is the plan running, else a save
    (if something runs), then provisioning and start-up if it needs instances not held, else the
    held workers' rejoin (their processes stay: ``runtime/park.py``), reload included: with
    ``costs.state_load``, what ``option``'s ranks must receive from those of ``holder`` (the plan
    whose ranks hold the state, less ``lost``) rather than the whole checkpoint."""
    if running is not None and _same_gpus(option, running):
        return 0.0
    needs = any(n > held.get(k, 0) for k, n in option.gpus.items()) or \
        any(n > held_on_demand.get(k, 0) for k, n in option.on_demand.items())
    start_s = costs.provisioning_s + costs.startup_s if needs else costs.rejoin_or_startup_s
    if costs.state_load is not None:
        start_s += costs.load_instead_s(costs.state_load.load_s(
            option.plan, holder=holder.plan if holder is not None else None, lost=lost or {}))
    return (costs.save_s if running is not None else 0.0) + start_s


def change_usd(option: PlanOption, *, running: PlanOption | None, costs: Costs, holder: PlanOption | None = None,
               lost: Mapping[GpuZone, int] | None = None, restores: bool = True) -> float:
    """The egress of ``change_s``'s load: what ``option``'s ranks receive across zones from those of
    ``holder`` (less ``lost``) and, when there is a checkpoint to resume from (``restores``), what
    they read from a bucket outside their regions; nothing for the plan running or without
    ``costs.state_load``."""
    if costs.state_load is None or (running is not None and _same_gpus(option, running)):
        return 0.0
    return costs.state_load.load_usd(option.plan, holder=holder.plan if holder is not None else None,
                                     lost=lost or {}, restores=restores)


def outlook(option: PlanOption, *, remaining: float, change: float, rates: Mapping[GpuZone, float],
            shares: Mapping[GpuZone, float], costs: Costs, change_usd: float = 0.0) -> Outlook:
    """``option``'s outlook after a change of ``change`` seconds whose load's egress is ``change_usd``."""
    h = hits_per_s(option, rates=rates, shares=shares)
    hit_s = costs.hit_s_at(share_per_hit(option, rates=rates, shares=shares), option.plan)
    x = option.throughput_samples_per_s
    eff = x / (1.0 + h * hit_s) if x > 0 else 0.0
    t = change + (remaining / eff if eff > 0 else math.inf)
    train_s = remaining / x * (1.0 + h * costs.work_lost_s) if eff > 0 else math.inf
    load_usd = change_usd
    if costs.state_load is not None and h > 0 and math.isfinite(train_s):  # each hit loads again
        load_usd += h * remaining / x * costs.state_load.hit_load_usd(option.plan)
    return Outlook(option=option, hits_per_s=h, effective_samples_per_s=eff, change_s=change, hit_s=hit_s, time_s=t,
                   cost_usd=option.usd_for(t, train_s) + load_usd if math.isfinite(t) else math.inf,
                   training_s=train_s, load_egress_usd=load_usd)


def deadline_margin_s(o: Outlook, *, quantile: float, costs: Costs) -> float:
    """How much later than expected (``o.time_s``) ``o`` finishes at the ``quantile`` of its
    preemptions: z sqrt(m) hits more than the m it expects over its training, each costing
    ``hit_s`` (the normal approximation of a Poisson count; z = 0 at the median).  The margin
    shrinks with the work left, so near the deadline a slower, cheaper plan may make it again."""
    expected_hits = o.expected_hits
    if expected_hits <= 0 or not math.isfinite(expected_hits) or quantile <= 0.5:
        return 0.0
    return NormalDist().inv_cdf(quantile) * math.sqrt(expected_hits) * o.hit_s


def regrow_shortfall(new: Outlook, held: Outlook, *, rates: Mapping[GpuZone, float],
                     shares: Mapping[GpuZone, float]) -> float:
    """The share of ``new``'s throughput that a plan on the GPUs still held (``held``) may forgo
    after a preemption before renting the instances ``new`` needs pays: sqrt(2 P q H).

    Renting replacements costs P = the extra provisioning of ``new`` at that restart; each hit
    (H per second) takes a share q of the plan (its expected GPUs per hit over its GPUs).  Renting
    them back every k hits costs P / k per hit and forgoes on average q (k - 1) / 2 of the
    throughput between hits (1 / H): least at k = sqrt(2 P / (q / H)), that is, when the plan on
    what is held falls short by k q = sqrt(2 P q H) (the economic order quantity).  Without
    preemptions or extra provisioning: 0 (rent at once).
    """
    p_s, h = new.change_s - held.change_s, new.hits_per_s
    gpus = new.option.num_gpus - sum(new.option.on_demand.values())
    if p_s <= 0 or h <= 0 or gpus <= 0 or hits_per_s(new.option, rates=rates, shares=shares) <= 0:
        return 0.0
    return math.sqrt(2.0 * p_s * share_per_hit(new.option, rates=rates, shares=shares) * h)


def switch_window(now: Outlook, new: Outlook) -> tuple[float, str]:
    """``switch_pays``' window tau in seconds, and what ends it, in words."""
    tau, why = now.time_s, "the end of the job"
    if now.hits_per_s > 0 and 1.0 / now.hits_per_s < tau:
        tau, why = 1.0 / now.hits_per_s, "the running plan's next preemption"
    if new.hits_per_s > 0 and 1.0 / new.hits_per_s < tau:
        tau, why = 1.0 / new.hits_per_s, "the new plan's next preemption"
    if not math.isfinite(tau):
        tau = new.time_s
    return tau, why


def _same_gpus(a: PlanOption, b: PlanOption) -> bool:
    return dict(a.gpus) == dict(b.gpus) and dict(a.on_demand) == dict(b.on_demand)
