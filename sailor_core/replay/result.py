"""What one replay found (``ReplayResult``): time, spend, re-plans, where the paid GPU time went."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sailor_core.network.storage_egress import is_bucket_pair


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelinePoint:
    time_s: float
    gpus_by_type: Mapping[str, int]
    throughput_samples_per_s: float


# What the GPU-seconds paid for went to: kept training; training redone after a preemption lost
# it; checkpoints (periodic, and the save before a planned switch); GPUs held while new instances
# boot; start-up and reload; the rest (the final save and terminate, rounding).
GPU_TIME_KINDS = ("training", "redone", "checkpointing", "provisioning", "starting", "other")


def activity_words(gpu_s: Mapping[str, float]) -> str:
    """``training 75%, starting 19%, ...``: the shares of the paid GPU-seconds, largest first."""
    total = sum(gpu_s.values())
    if total <= 0:
        return "nothing (no GPU was paid for)"
    shares = sorted(((v / total, k) for k, v in gpu_s.items() if v > 0), reverse=True)
    return ", ".join(f"{k} {x:.0%}" if x >= 0.005 else f"{k} <1%" for x, k in shares)


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    time_s: float
    action: str
    reason: str
    num_gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    policy: str
    finished: bool
    stop_reason: str
    time_to_train_s: float | None     # when the target was reached (None: not reached)
    end_s: float                      # when the last instance was released
    samples_done: float
    samples_target: float
    usd_spent: float
    budget_usd: float | None
    useful_work_fraction: float       # GPU-seconds of kept progress / GPU-seconds paid
    num_replans: int                  # plan changes after the first launch
    num_restarts: int                 # of which forced by a preemption
    num_preemptions_hit: int          # events that took GPUs of ours
    work_lost_samples: float
    wait_s: float                     # time holding nothing while waiting for capacity
    usd_by_gpu_zone: Mapping[str, float]
    timeline: tuple[TimelinePoint, ...]
    decisions: tuple[DecisionRecord, ...]
    planner_calls: int = 0
    usd_by_market: Mapping[str, float] = field(default_factory=dict)
    num_declined: int = 0             # switches the controller weighed and declined (Decision.declined)
    # where the paid GPU-seconds went (GPU_TIME_KINDS): ``training`` over their sum is the useful fraction
    gpu_s_by_activity: Mapping[str, float] = field(default_factory=dict)
    num_interims: int = 0             # changes whose survivors trained while new instances booted
    egress_usd: float = 0.0           # of ``usd_spent``: the simulator's egress of the iterations trained, and the handovers'
    # of ``egress_usd``: the state handed over across zones at the changes (StateLoad.handover_egress)
    handover_egress_usd: float = 0.0
    handover_egress_bytes: float = 0.0
    # of ``egress_usd``: the checkpoint read from a bucket outside the readers' regions at the
    # changes (StateLoad.restore_egress); the saves to it are in the training's egress
    restore_egress_usd: float = 0.0
    restore_egress_bytes: float = 0.0

    def to_dict(self, *, with_timeline: bool = False) -> dict:
        out = {
            "policy": self.policy, "finished": self.finished, "stop_reason": self.stop_reason,
            "time_to_train_s": self.time_to_train_s, "end_s": self.end_s,
            "samples_done": self.samples_done, "samples_target": self.samples_target,
            "usd_spent": self.usd_spent, "budget_usd": self.budget_usd,
            "useful_work_fraction": self.useful_work_fraction, "num_replans": self.num_replans,
            "num_restarts": self.num_restarts, "num_preemptions_hit": self.num_preemptions_hit,
            "work_lost_samples": self.work_lost_samples, "wait_s": self.wait_s,
            "usd_by_gpu_zone": dict(self.usd_by_gpu_zone), "planner_calls": self.planner_calls,
            "usd_by_market": dict(self.usd_by_market), "num_declined": self.num_declined,
            "gpu_s_by_activity": dict(self.gpu_s_by_activity), "num_interims": self.num_interims,
        } | ({"egress_usd": self.egress_usd} if self.egress_usd else {}) \
            | ({"handover_egress_usd": self.handover_egress_usd, "handover_egress_bytes": self.handover_egress_bytes}
               if self.handover_egress_bytes else {}) \
            | ({"restore_egress_usd": self.restore_egress_usd, "restore_egress_bytes": self.restore_egress_bytes}
               if self.restore_egress_bytes else {})
        if with_timeline:
            out["timeline"] = [
                {"time_s": p.time_s, "gpus_by_type": dict(p.gpus_by_type),
                 "throughput_samples_per_s": p.throughput_samples_per_s} for p in self.timeline
            ]
            out["decisions"] = [
                {"time_s": d.time_s, "action": d.action, "reason": d.reason, "num_gpus": d.num_gpus}
                for d in self.decisions
            ]
        return out


def load_egress_fields(pairs: Mapping[tuple[str, str], tuple[float, float]]) -> dict[str, float]:
    """``ReplayResult``'s egress of the changes' loads from the (bytes, USD) charged per pair
    besides the training's (the simulator's, with its saves to a far bucket): the handovers' per
    zone pair, the restores' per bucket pair (``network/storage_egress.is_bucket_pair``)."""
    handover = [v for pair, v in pairs.items() if not is_bucket_pair(*pair)]
    restore = [v for pair, v in pairs.items() if is_bucket_pair(*pair)]
    return {"handover_egress_usd": sum(usd for _, usd in handover), "handover_egress_bytes": sum(n for n, _ in handover),
            "restore_egress_usd": sum(usd for _, usd in restore), "restore_egress_bytes": sum(n for n, _ in restore)}
