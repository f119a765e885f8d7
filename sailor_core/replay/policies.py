"""The replay's side of the policies it compares (``controller.policies``): its costs of change as
the controller weighs them, and the one GPU type the single-type policies get."""

from __future__ import annotations

from collections.abc import Iterable

from sailor_core.controller import Costs, PlanFn, restrict
from sailor_core.errors import InputError
from sailor_core.replay.costs import ChangeCosts
from sailor_core.traces import AvailabilityTrace

def controller_costs(costs: ChangeCosts, zones: Iterable[str] = ()) -> Costs:
    """The replay's costs of change as the controller weighs them (``controller_config``'s
    ``costs``): loading the checkpoint is part of a start-up and of a rejoin, and a preemption in
    ``zones`` loses the work since the last checkpoint where the notice is shorter than a save; new
    instances' start-up is their standby workers' handover where they have them; with the state
    handed over in memory, a change's load is what its ranks must receive (``state_load``), and
    with or without it what they read from a far checkpoint bucket is egress (its time stays the
    start-up's whole reload without the handover)."""
    return Costs(save_s=costs.save_s, provisioning_s=costs.provisioning_s,
                 startup_s=costs.new_instance_start_s + costs.load_s,
                 rejoin_s=costs.rejoin_s + costs.load_s, work_lost_s=costs.work_lost_s(zones),
                 state_load=costs.state_load)


def pick_single_type(trace: AvailabilityTrace, plan_fn: PlanFn) -> str:
    """The GPU type a user would pick at the start: the one whose best plan on the
    first row's availability is fastest; if nothing runs there, on each pool's
    largest count over the trace."""
    peak = {k: max(c.get(k, 0) for _, c in trace.rows) for k in trace.keys}
    for avail in (_first_row(trace), peak):
        best_type, best_x = None, 0.0
        for gpu in _gpu_types(avail):
            options = plan_fn(restrict(avail, (gpu,)))
            x = options[0].throughput_samples_per_s if options else 0.0
            if x > best_x:
                best_type, best_x = gpu, x
        if best_type is not None:
            return best_type
    raise InputError("no GPU type of the trace can run the model, even at its peak availability")


def single_type_requests(trace: AvailabilityTrace) -> list[dict]:
    """What ``pick_single_type`` asks the planner first (each GPU type alone on the first
    row), so that worker processes can search it while the replay starts."""
    first = _first_row(trace)
    return [restrict(first, (gpu,)) for gpu in _gpu_types(first)]


def _first_row(trace: AvailabilityTrace) -> dict:
    return {k: n for k, n in trace.rows[0][1].items() if n > 0}


def _gpu_types(avail) -> list[str]:
    return sorted({g for (g, _), n in avail.items() if n > 0})
