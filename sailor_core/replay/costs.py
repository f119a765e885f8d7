"""Costs of a change, the same for every policy: provisioning, start-up, checkpoints, notice."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sailor_core.catalog.clouds import cloud_facts
from sailor_core.controller.checkpoint_egress import CheckpointEgress
from sailor_core.controller.options import PlanFn
from sailor_core.controller.state_load import DEFAULT_STORAGE_BW_BYTES_PER_S, StateLoad
from sailor_core.errors import InputError
from sailor_core.network.storage_egress import BucketPlace
from sailor_core.traces import GpuZone
from sailor_core.zones import parse_zone


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeCosts:
    provisioning_s: float = 90.0          # spot request to a running VM (typically 1-2 min)
    startup_s: float = 60.0               # worker processes start, import, NCCL/gloo rendezvous
    # A change onto instances all held: their parked workers (runtime/park.py) keep their
    # processes and re-form the job: new process groups and the stages rebuilt, no import or
    # CUDA start (the reload is counted apart, as for a start-up)
    rejoin_s: float = 10.0
    # Standby workers (runtime/agent.py): an instance's agent starts its workers at boot, parked
    # without state, so their start-up overlaps the provisioning and the first assignment is a
    # handover like a rejoin.  False models workers that start only once the VM runs.
    standby_workers: bool = True
    # State handed over in memory (runtime/handover.py): a change's ranks take their state from
    # the ranks held that keep it, over the job's network, and only what no survivor holds from
    # the checkpoint (controller/state_load.py).  False: every change reloads the checkpoint.
    handover: bool = True
    checkpoint_bytes: float = 0.0         # model + optimizer state written per checkpoint
    storage_bw_bytes_per_s: float = DEFAULT_STORAGE_BW_BYTES_PER_S  # aggregate write/read bandwidth to the checkpoint store
    checkpoint_interval_s: float = 1800.0  # periodic checkpoints while training
    terminate_s: float = 30.0             # instance shutdown after the final checkpoint
    # Where the checkpoint bucket lies (network/storage_egress.py): from outside its region the
    # saves and restores are egress, weighed and charged as the controller expects them (``saves``,
    # ``load_egress_for``).  None: beside every zone, nothing billed.
    bucket: BucketPlace | None = None

    def __post_init__(self) -> None:
        for name in ("provisioning_s", "startup_s", "rejoin_s", "checkpoint_bytes", "terminate_s"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.storage_bw_bytes_per_s <= 0 or self.checkpoint_interval_s <= 0:
            raise InputError("storage bandwidth and checkpoint interval must be positive")

    @property
    def save_s(self) -> float:
        return self.checkpoint_bytes / self.storage_bw_bytes_per_s

    @property
    def load_s(self) -> float:
        return self.checkpoint_bytes / self.storage_bw_bytes_per_s

    @property
    def state_load(self) -> StateLoad:
        """The load of a change, as the controller weighs it too."""
        return StateLoad(storage_load_s=self.load_s, storage_bw_bytes_per_s=self.storage_bw_bytes_per_s,
                         handover=self.handover, bucket=self.bucket)

    def load_for_s(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int]) -> float:
        """Seconds until ``new`` (a ``Plan``) holds the state, ``holder``'s ranks (less ``lost``)
        keeping theirs: ``load_s`` without the handover."""
        if not self.handover:
            return self.load_s
        return self.state_load.load_s(new, holder=holder, lost=lost)

    def load_egress_for(self, new: Any, *, holder: Any,
                        lost: Mapping[GpuZone, int]) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, USD) per pair that ``load_for_s``'s load sends: its handover across zones, and
        its restore from a bucket outside the readers' regions (``StateLoad.load_egress``)."""
        return self.state_load.load_egress(new, holder=holder, lost=lost)

    @property
    def saves(self) -> CheckpointEgress | None:
        """The periodic saves' egress to a bucket that bills them (None: it bills none)."""
        if self.bucket is None or not self.bucket.metered:
            return None
        return CheckpointEgress(place=self.bucket, every_s=self.checkpoint_interval_s)

    def with_saves(self, plan_fn: PlanFn | None) -> PlanFn | None:
        """``plan_fn`` whose options carry their saves' egress per hour of training (``saves``), as
        the train-job flow's planner does; unchanged where the bucket bills none."""
        saves = self.saves
        if saves is None or plan_fn is None:
            return plan_fn
        return lambda *args: tuple(saves.with_egress(o) for o in plan_fn(*args))

    @property
    def shutdown_s(self) -> float:
        """Paid after the decision to stop: the final checkpoint, then termination."""
        return self.save_s + self.terminate_s

    @property
    def new_instance_start_s(self) -> float:
        """From new instances running to their workers ready to train, the reload apart: with
        standby workers a rejoin, their start-up having overlapped the provisioning (what of it
        does not fit in the provisioning still counts), else the whole start-up."""
        if not self.standby_workers:
            return self.startup_s
        return max(self.rejoin_s, self.startup_s - self.provisioning_s)

    @property
    def planned_change_s(self) -> float:
        """Downtime of a planned switch: save, provision, start, load."""
        return self.save_s + self.provisioning_s + self.new_instance_start_s + self.load_s

    def notice_s(self, zone: str) -> float:
        """The zone's cloud's preemption notice (clouds.json): when the checkpoint save fits in
        it, an emergency save loses no work."""
        return cloud_facts(parse_zone(zone).cloud).preemption_notice_s

    def work_lost_s(self, zones: Iterable[str]) -> float:
        """Training a preemption is expected to cost in ``zones``: none where the notice covers an
        emergency save, else the progress since the last periodic checkpoint, half an interval
        on average (the worst of the zones)."""
        zones = list(zones)
        if not zones or all(self.save_s <= self.notice_s(z) for z in zones):
            return 0.0
        return self.checkpoint_interval_s / 2

