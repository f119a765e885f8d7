"""The plan: how a job is split into pipeline stages and data-parallel replicas.

One format serves the CLI, the planner's output, the simulator and the engine
(see the plan-file section of DESIGN.md).  ``load_plan``/``plan_from_dict``
validate untrusted input with pydantic; ``validate_plan`` checks the plan
against the model and GPU catalogs.

Routing rule shared by simulator, planner and engine: micro-batch ``m`` of an
iteration is processed in stage ``i`` by replica ``m mod D_i``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic

from sailor_core.catalog.gpus import get_gpu, normalize_gpu_name
from sailor_core.catalog.hf_config import resolve_model
from sailor_core.catalog.models import (ModelSpec, get_model, is_shipped_model, model_spec_from_dict,
                                      model_spec_to_dict, register_model, tp_split_problem)
from sailor_core.errors import InputError, PlanError, UnknownNameError
from sailor_core.plan.routing import replica_of
from sailor_core.zones import parse_zone


SPOT = "spot"
ON_DEMAND = "on_demand"
MARKETS = (SPOT, ON_DEMAND)
# A stage's memory levers (see docs/engine.md): which activations its backward re-runs, and how far
# its optimizer states (1) and gradients (2) are sharded over its data-parallel group (ZeRO).
RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = "none", "selective", "full"
RECOMPUTE_MODES = (RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL)
ZERO_STAGES = (0, 1, 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class Replica:
    """One data-parallel copy of a stage on ``tp_degree`` GPUs of one node.

    ``market``: how its node is rented, ``"spot"`` or ``"on_demand"``; None (the plan file
    leaves it out) is the job's own market (``simulate(spot=...)``, the job's ``spot`` flag).
    A mixed plan keeps part of the job on on-demand nodes, which are never preempted.
    """

    gpu: str
    tp_degree: int
    zone: str
    market: str | None = None

    def on_spot(self, default: bool = True) -> bool:
        """Whether this replica's node is a spot instance, ``default`` being the job's market."""
        return default if self.market is None else self.market == SPOT


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """Layers ``[layer_start, layer_end)`` on ``replicas``.  The replicas' order is the stage's
    data-parallel ring: the engine's groups follow it (ranks rise along it, ``plan.layout``),
    the simulator times the ring by its hops in that order and prices every hop that changes
    zone (``simulator.compose.ring_hop_usd_per_byte``), and micro-batch m goes to replica
    m mod D in it (``plan.routing``).  The embedding group of a tied model split over stages is
    the first stage's replicas then the last stage's.  The planner lists a stage's replicas
    grouped by zone in ``zones.ring_order_key`` order, so its rings cross as few zone, region,
    continent and cloud boundaries as a ring can."""

    layer_start: int  # inclusive
    layer_end: int  # exclusive
    replicas: tuple[Replica, ...]
    recompute: str = RECOMPUTE_NONE  # one of RECOMPUTE_MODES
    zero_stage: int = 0  # one of ZERO_STAGES; sharded over this stage's replicas

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start

    @property
    def dp_degree(self) -> int:
        return len(self.replicas)

    @property
    def num_gpus(self) -> int:
        return sum(r.tp_degree for r in self.replicas)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: str
    global_batch_size: int
    micro_batch_size: int
    stages: tuple[Stage, ...]
    seq_len: int | None = None
    regime: str | None = None

    @property
    def pp_degree(self) -> int:
        return len(self.stages)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per iteration, over all replicas."""
        return self.global_batch_size // self.micro_batch_size

    @property
    def num_gpus(self) -> int:
        return sum(s.num_gpus for s in self.stages)

    def gpus_by_type_zone(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for stage in self.stages:
            for r in stage.replicas:
                key = (r.gpu, r.zone)
                counts[key] = counts.get(key, 0) + r.tp_degree
        return counts

    def on_demand_gpus(self) -> dict[tuple[str, str], int]:
        """GPUs per (type, zone) on replicas marked on demand (the rest follow the job's market)."""
        counts: dict[tuple[str, str], int] = {}
        for stage in self.stages:
            for r in stage.replicas:
                if r.market == ON_DEMAND:
                    counts[(r.gpu, r.zone)] = counts.get((r.gpu, r.zone), 0) + r.tp_degree
        return counts

    def effective_seq_len(self) -> int:
        return self.seq_len or get_model(self.model).seq_len

    def replica_for_microbatch(self, stage_index: int, microbatch: int) -> int:
        return replica_of(microbatch, self.stages[stage_index].dp_degree)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "stages": [
                {
                    "layers": [s.layer_start, s.layer_end],
                    "replicas": [
                        {"gpu": r.gpu, "tp": r.tp_degree, "zone": r.zone}
                        | ({"market": r.market} if r.market is not None else {})
                        for r in s.replicas
                    ],
                }
                | ({"recompute": s.recompute} if s.recompute != RECOMPUTE_NONE else {})
                | ({"zero": s.zero_stage} if s.zero_stage else {})
                for s in self.stages
            ],
        }
        if self.seq_len is not None:
            out["seq_len"] = self.seq_len
        if self.regime is not None:
            out["regime"] = self.regime
        if not is_shipped_model(self.model):  # a model folder's: whoever reads the plan learns the model
            out["model_spec"] = model_spec_to_dict(get_model(self.model))
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# ---- untrusted input -------------------------------------------------------


class _ReplicaIn(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    gpu: str
    tp: int = pydantic.Field(1, ge=1)
    zone: str = "local"
    market: Literal["spot", "on_demand"] | None = None


class _StageIn(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    layers: list[int] = pydantic.Field(min_length=2, max_length=2)
    replicas: list[_ReplicaIn] = pydantic.Field(min_length=1)
    recompute: Literal["none", "selective", "full"] = RECOMPUTE_NONE
    zero: Literal[0, 1, 2] = 0


class _PlanIn(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)
    model: str
    global_batch_size: int = pydantic.Field(ge=1)
    micro_batch_size: int = pydantic.Field(ge=1)
    stages: list[_StageIn] = pydantic.Field(min_length=1)
    seq_len: int | None = pydantic.Field(None, ge=1)
    regime: str | None = None
    model_spec: dict[str, Any] | None = None


def format_validation_error(exc: pydantic.ValidationError, what: str) -> str:
    """One line naming the first problem of a pydantic error."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "top level"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid {what}: {where}: {err.get('msg', 'invalid')}{more}"


def _plan_model(name: str, model_spec: dict[str, Any] | None) -> str:
    """The plan's model: a catalog name, or a model folder's, registered from the spec the plan
    carries (a worker may not see the folder) or else read from the folder."""
    if model_spec is None:
        return resolve_model(name)
    spec = model_spec_from_dict(model_spec)
    if spec.name != name:
        raise PlanError(f"the plan's model_spec is of {spec.name!r}, not of its model {name!r}")
    register_model(spec)
    return spec.name


def plan_from_dict(data: Any, *, validate: bool = True) -> Plan:
    """Build a Plan from parsed JSON; raises PlanError naming the problem."""
    try:
        raw = _PlanIn.model_validate(data)
    except pydantic.ValidationError as exc:
        raise PlanError(format_validation_error(exc, "plan")) from None
    try:
        plan = Plan(
            model=_plan_model(raw.model, raw.model_spec),
            global_batch_size=raw.global_batch_size,
            micro_batch_size=raw.micro_batch_size,
            seq_len=raw.seq_len,
            regime=raw.regime,
            stages=tuple(
                Stage(
                    layer_start=s.layers[0],
                    layer_end=s.layers[1],
                    replicas=tuple(
                        Replica(gpu=normalize_gpu_name(r.gpu), tp_degree=r.tp, zone=r.zone, market=r.market)
                        for r in s.replicas
                    ),
                    recompute=s.recompute,
                    zero_stage=s.zero,
                )
                for s in raw.stages
            ),
        )
    except (UnknownNameError, InputError) as exc:
        raise PlanError(f"invalid plan: {exc}") from None
    if validate:
        validate_plan(plan)
    return plan


def with_on_demand(plan: Plan, on_demand: Mapping[tuple[str, str], int]) -> Plan:
    """``plan`` with about ``on_demand[(gpu, zone)]`` GPUs of each pool on on-demand nodes and
    the rest on spot: replicas are marked in plan order (the first stages first), each whole,
    until the pool's count is reached (a replica of TP t may take it up to t - 1 past it)."""
    left = {k: n for k, n in on_demand.items() if n > 0}
    stages = []
    for stage in plan.stages:
        replicas = []
        for r in stage.replicas:
            key = (r.gpu, r.zone)
            market = SPOT
            if left.get(key, 0) > 0:
                market = ON_DEMAND
                left[key] -= r.tp_degree
            replicas.append(dataclasses.replace(r, market=market))
        stages.append(dataclasses.replace(stage, replicas=tuple(replicas)))
    return dataclasses.replace(plan, stages=tuple(stages))


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read plan file {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise PlanError(f"plan file {str(path)!r} is not valid JSON (not UTF-8 text: {exc.reason})") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"plan file {str(path)!r} is not valid JSON: {exc}") from None
    return plan_from_dict(data)


def validate_plan(plan: Plan, model: ModelSpec | None = None) -> None:
    """Check layer coverage, batch sizes, TP degrees and zones; PlanError on the first problem."""
    model = model or get_model(plan.model)
    n = model.num_layer_indices
    if plan.global_batch_size % plan.micro_batch_size:
        raise PlanError(
            f"global_batch_size {plan.global_batch_size} is not a multiple of "
            f"micro_batch_size {plan.micro_batch_size}"
        )
    expected = 0
    for i, stage in enumerate(plan.stages):
        if stage.layer_start != expected:
            problem = "overlaps" if stage.layer_start < expected else "leaves a gap before"
            raise PlanError(
                f"stage {i} starts at layer {stage.layer_start} and {problem} layer {expected}: "
                f"stages must cover layers 0..{n - 1} of {model.name} in order, each once"
            )
        if stage.layer_end <= stage.layer_start:
            raise PlanError(f"stage {i} has an empty layer range [{stage.layer_start}, {stage.layer_end})")
        expected = stage.layer_end
        for j, rep in enumerate(stage.replicas):
            gpu = get_gpu(rep.gpu)
            if rep.tp_degree not in _valid_tp_degrees(gpu.max_gpus_per_node):
                raise PlanError(
                    f"stage {i} replica {j}: TP degree {rep.tp_degree} does not fit a {gpu.name} "
                    f"node (at most {gpu.max_gpus_per_node} GPUs per node, power of two)"
                )
            problem = tp_split_problem(model, rep.tp_degree)
            if problem:
                raise PlanError(f"stage {i} replica {j}: {problem}")
            try:
                parse_zone(rep.zone)
            except UnknownNameError as exc:
                raise PlanError(f"stage {i} replica {j}: {exc}") from None
    if expected != n:
        raise PlanError(
            f"stages end at layer {expected} but {model.name} has layers 0..{n - 1}: "
            f"layers {expected}..{n - 1} are not covered"
        )
    if plan.num_microbatches < max(s.dp_degree for s in plan.stages):
        raise PlanError(
            f"{plan.num_microbatches} micro-batches per iteration cannot keep "
            f"{max(s.dp_degree for s in plan.stages)} replicas of a stage busy"
        )


def _valid_tp_degrees(max_per_node: int) -> set[int]:
    return {d for d in (1, 2, 4, 8, 16) if d <= max_per_node}
