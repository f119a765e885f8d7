"""The interim plan: what the survivors of a preemption train on while new instances boot.

After a preemption the controller's next plan often needs instances that are not running
yet; until they are, the GPUs it keeps would sit idle (a few minutes per change, several
per cent of a stormy trace's GPU time).  Instead those GPUs train on the best plan that fits
them alone, save, and the next plan starts from that checkpoint.  Used by the replay and the
train-job flow alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from sailor_core.controller.options import PlanFn, PlanOption
from sailor_core.traces import GpuZone


def kept_gpus(new_gpus: Mapping[GpuZone, int], held: Mapping[GpuZone, int]) -> dict[GpuZone, int]:
    """The GPUs of ``new_gpus`` (per pool) that are held already: the ones an interim may use."""
    kept = {k: min(n, held.get(k, 0)) for k, n in new_gpus.items()}
    return {k: n for k, n in kept.items() if n > 0}


def interim_option(plan_fn: PlanFn, kept: Mapping[GpuZone, int]) -> PlanOption | None:
    """The fastest plan on ``kept`` alone (whatever the job's objective: those GPUs are paid
    for while the new instances boot either way); None when nothing trains on them."""
    if not kept:
        return None
    fits = [o for o in plan_fn(dict(kept))
            if o.throughput_samples_per_s > 0 and not o.on_demand
            and all(n <= kept.get(k, 0) for k, n in o.gpus.items())]
    return max(fits, key=lambda o: o.throughput_samples_per_s, default=None)


def interim_pays(*, window_s: float, rejoin_s: float, load_s: float, save_s: float,
                 interim_samples_per_s: float, next_samples_per_s: float) -> bool:
    """Whether an interim of ``window_s`` (from the preemption until the new instances run)
    gains more than it costs: its workers rejoin and load, train, then save, and that save
    delays the next plan's start by ``save_s``."""
    train_s = window_s - rejoin_s - load_s - save_s
    return train_s > 0 and interim_samples_per_s * train_s > next_samples_per_s * save_s
