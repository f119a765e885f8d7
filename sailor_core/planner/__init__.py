"""The planner: the best plans for a model over GPUs available per (type, zone).

``plan_job(request)`` searches micro-batch size, pipeline depth, uneven layer
splits, per-stage data-parallel replicas (mixing GPU types), TP per replica
and zone placement; every plan it returns is scored by ``simulate`` itself.
See ``docs/planner.md``.
"""

from sailor_core.planner.api import IdealBounds, ideal_bounds, plan_job
from sailor_core.objective import Objective
from sailor_core.planner.request import PlanRequest, make_request, parse_gpu_list
from sailor_core.planner.result import ParetoPoint, PlannedCandidate, PlanResult, pareto_front

__all__ = [
    "IdealBounds",
    "Objective",
    "ParetoPoint",
    "PlanRequest",
    "PlanResult",
    "PlannedCandidate",
    "ideal_bounds",
    "make_request",
    "pareto_front",
    "parse_gpu_list",
    "plan_job",
]
