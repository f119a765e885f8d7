"""What the planner returns: ranked plans with their simulated figures, the search time, the Pareto front."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sailor_core.plan.types import Plan
from sailor_core.simulator.result import SimResult


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedCandidate:
    """One plan and ``simulate(plan)``'s verdict on it (the figures are the simulator's, not the planner's)."""

    plan: Plan
    sim: SimResult
    notes: tuple[str, ...] = ()  # why its stages keep their memory levers (planner/levers.notes)

    @property
    def throughput_samples_per_s(self) -> float:
        return self.sim.throughput_samples_per_s

    @property
    def usd_per_iteration(self) -> float:
        return self.sim.usd_per_iteration

    def gpus_by_type_zone(self) -> dict[str, int]:
        return {f"{g}@{z}": n for (g, z), n in sorted(self.plan.gpus_by_type_zone().items())}

    def to_dict(self) -> dict[str, Any]:
        sim = self.sim
        return {
            "plan": self.plan.to_dict(),
            "throughput_samples_per_s": sim.throughput_samples_per_s,
            "tokens_per_s": sim.tokens_per_s,
            "iteration_time_s": sim.iteration_time_s,
            "usd_per_iteration": sim.usd_per_iteration,
            "usd_per_hour": sim.usd_per_hour,
            "peak_memory_bytes": sim.peak_memory_bytes,
            "peak_memory_bytes_per_stage": [s.peak_memory_bytes for s in sim.stages],
            "num_gpus": self.plan.num_gpus,
            "gpus": self.gpus_by_type_zone(),
            "breakdown": dict(sim.breakdown),
            "bottleneck": sim.bottleneck,
        } | ({"notes": list(self.notes)} if self.notes else {})


@dataclass(frozen=True, slots=True, kw_only=True)
class ParetoPoint:
    usd_per_iteration: float
    throughput_samples_per_s: float
    num_gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    candidates: tuple[PlannedCandidate, ...]  # best first
    search_time_s: float
    pareto: tuple[ParetoPoint, ...]  # cheapest first, each faster than the one before
    num_evaluated: int  # simulate() calls
    exhausted: bool  # True when the bounds proved nothing unexplored can enter the top N
    objective: str
    num_disagreements: int = 0  # plans where the search's evaluator and simulate differed (a bug if > 0)
    # The data-parallel degrees ``exhausted`` speaks for, in words (``search.shapes.DP_SPACES``)
    searched_dp_degrees: str = ""
    # What a stage may hold in the space ``exhausted`` speaks for (``mixed_space.STAGE_SPACES``)
    searched_stages: str = ""
    # why the first plan is first when it is not the best found (planner.simpler), and which of
    # its stages mix GPU types, and whether the proof covers them (explain.why_mixed)
    explanation: str = ""

    @property
    def best(self) -> PlannedCandidate:
        return self.candidates[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "search_time_s": self.search_time_s,
            "objective": self.objective,
            "num_evaluated": self.num_evaluated,
            "exhausted": self.exhausted,
            "num_disagreements": self.num_disagreements,
            "searched_dp_degrees": self.searched_dp_degrees,
            "searched_stages": self.searched_stages,
            "explanation": self.explanation,
            "plans": [c.to_dict() for c in self.candidates],
            "pareto": [
                {"usd_per_iteration": p.usd_per_iteration,
                 "throughput_samples_per_s": p.throughput_samples_per_s,
                 "num_gpus": p.num_gpus}
                for p in self.pareto
            ],
        }


def pareto_front(points: list[ParetoPoint]) -> tuple[ParetoPoint, ...]:
    """Points no other point beats on both cost (lower) and throughput (higher)."""
    front: list[ParetoPoint] = []
    best_thr = -1.0
    for p in sorted(points, key=lambda p: (p.usd_per_iteration, -p.throughput_samples_per_s)):
        if p.throughput_samples_per_s > best_thr:
            front.append(p)
            best_thr = p.throughput_samples_per_s
    return tuple(front)
