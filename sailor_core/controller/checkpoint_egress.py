"""What a plan's checkpoints cost in egress when the bucket lies outside its zones' regions.

The engine writes each stage's layers (weights and AdamW moments) from the stage's first replica
(``runtime/stage_checkpoint.layer_states``), so one save sends that stage's share of the
checkpoint (``state_load.stage_state_bytes``) from that replica's zone to the bucket, priced per
pair as the ledger charges what the engine meters (``network/storage_egress.py``).  The
controller weighs it per hour of training (``with_egress``: one save every
``checkpoint_every_steps`` iterations; the replay's, one every checkpoint interval) and keeps one save's egress in reserve against the budget
(the save a stop makes, or the next interval's: ``CheckpointEgress.reserve_usd``).  Restores are
weighed with the change that makes them: a change's load (``StateLoad.restore_egress``, the bucket
being ``place``: ``tasks.control.flow_costs``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sailor_core.controller.options import PlanOption, egress_rate_usd_per_hr
from sailor_core.controller.state_load import stage_state_bytes
from sailor_core.network.storage_egress import BucketPlace

_S_PER_HR = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointEgress:
    """A job's checkpoint bucket and how often it saves there."""

    place: BucketPlace
    every_steps: int = 1
    # One save every this many seconds of training instead (the replay's periodic checkpoints,
    # ``ChangeCosts.checkpoint_interval_s``); 0: every ``every_steps`` steps.
    every_s: float = 0.0

    def save_egress(self, plan: Any) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, USD) per (zone, bucket) of one save of ``plan`` (a ``Plan``; None: nothing known)."""
        out: dict[tuple[str, str], tuple[float, float]] = {}
        if plan is None or not self.place.metered:
            return out
        for stage in plan.stages:
            zone = stage.replicas[0].zone
            if not self.place.crosses(zone):
                continue
            num_bytes = stage_state_bytes(plan.model, plan.regime, stage.layer_start, stage.layer_end)
            pair = (zone, self.place.name)
            old_bytes, old_usd = out.get(pair, (0.0, 0.0))
            out[pair] = (old_bytes + num_bytes, old_usd + num_bytes * self.place.usd_per_byte(zone))
        return out

    def save_usd(self, plan: Any) -> float:
        return sum(usd for _, usd in self.save_egress(plan).values())

    def reserve_usd(self, option: PlanOption | None) -> float:
        """One save of ``option``'s plan: what the budget must keep for the save a stop makes."""
        return 0.0 if option is None else self.save_usd(option.plan)

    def with_egress(self, option: PlanOption) -> PlanOption:
        """``option`` with its saves' egress added per hour of training."""
        usd = self.save_usd(option.plan)
        if usd <= 0 or option.plan is None:
            return option
        per_hr = usd * _S_PER_HR / self.every_s if self.every_s > 0 else egress_rate_usd_per_hr(
            usd / self.every_steps, option.throughput_samples_per_s, option.plan.global_batch_size)
        return dataclasses.replace(option, egress_usd_per_hr=option.egress_usd_per_hr + per_hr)
