"""What the planner is asked: model, GPUs available per (type, zone), objective and limits."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from sailor_core.catalog.gpus import normalize_gpu_name
from sailor_core.catalog.hf_config import resolve_model
from sailor_core.catalog.models import get_model
from sailor_core.errors import InputError, UnknownNameError
from sailor_core.objective import Objective
from sailor_core.planner.ranking import PLAN_RANKINGS, PlanRanking
from sailor_core.specs.plan import DEFAULT_MEMORY_LEVERS, MEMORY_LEVER_MODES
from sailor_core.zones import parse_zone

GpuZone = tuple[str, str]  # (canonical GPU type, zone)

# Sailor's artifact trains OPT-350M at 1024 sequences per iteration; used when no batch is given.
DEFAULT_GLOBAL_BATCH_SIZE = 1024
# A TP group lives on one node: 8 GPUs on the usual GPU servers.
DEFAULT_MAX_TP_DEGREE = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """How the planner searches and what it answers: the settings callers tune (the defaults cover
    what the planner searches; the replay and tests shrink them)."""

    top_n: int = 5
    micro_batch_sizes: tuple[int, ...] | None = None  # default: powers of two dividing the batch
    max_stages: int = 16
    max_tp_degree: int = DEFAULT_MAX_TP_DEGREE
    # stages may mix GPU types: leftover GPUs join a stage (planner/mixing.py) and, on small pools,
    # the whole mixed space is walked with a bound (planner/mixed_space.py)
    mixed_stages: bool = True
    max_evaluations: int = 4000  # work of the best-first search before it stops: evaluations (a split: 1/4)
    max_shapes_scored: int = 20000  # shapes given a bound by the lazy order before it stops adding
    patience: int = 80  # evaluated shape orders in a row that do not improve the top N before the search stops
    collect_pareto: bool = False  # evaluate more candidates so the cost/throughput front is wider
    # ZeRO and activation recomputation per stage (planner/levers.py; MEMORY_LEVER_MODES): "off",
    # "when-needed" (only when no plan fits without them), "pays" (also where they make a plan
    # that fits faster or cheaper, within about the plain search's time) or "always" (searched
    # in full for every request)
    memory_levers: str = DEFAULT_MEMORY_LEVERS


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest(SearchSettings):
    """A planning problem, with the settings of its search.  Build it with ``make_request`` to
    validate untrusted values."""

    model: str
    availability: Mapping[GpuZone, int]
    objective: Objective = Objective.THROUGHPUT
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    max_usd_per_iteration: float | None = None
    max_usd_per_hour: float | None = None
    # samples (sequences) per second; Sailor's "iterations/s" floor times the global batch.
    min_throughput_samples_per_s: float | None = None
    seq_len: int | None = None
    regime: str | None = None
    spot: bool = True

    @property
    def total_gpus(self) -> int:
        return sum(self.availability.values())

    @property
    def ranking(self) -> PlanRanking:
        """How the search orders plans for the objective."""
        return PLAN_RANKINGS[self.objective]

    @property
    def has_cost_caps(self) -> bool:
        """A cap on USD per iteration or per hour."""
        return self.max_usd_per_iteration is not None or self.max_usd_per_hour is not None


def parse_gpu_list(text: str) -> dict[GpuZone, int]:
    """``"A100-40@us-central1-a=32,V100-16@us-central1-a=96"`` -> {(gpu, zone): count}.

    The zone may be left out (``A100-40=8``): such GPUs are placed in ``local``.
    """
    out: dict[GpuZone, int] = {}
    items = [p.strip() for p in str(text).split(",") if p.strip()]
    if not items:
        raise InputError("--gpus is empty: give e.g. 'A100-40@us-central1-a=32,V100-16@us-central1-a=96'")
    for item in items:
        name, sep, count_text = item.partition("=")
        if not sep:
            raise InputError(f"--gpus item {item!r} has no '=COUNT' (expected GPU@ZONE=COUNT)")
        gpu_text, _, zone = name.partition("@")
        zone = zone.strip() or "local"
        try:
            count = int(count_text)
        except ValueError:
            raise InputError(f"--gpus item {item!r}: count {count_text!r} is not an integer") from None
        if count < 0:
            raise InputError(f"--gpus item {item!r}: count must not be negative")
        gpu = normalize_gpu_name(gpu_text.strip())
        parse_zone(zone)
        out[(gpu, zone)] = out.get((gpu, zone), 0) + count
    return out


def _positive_or_none(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{what} must be a positive number, got {value!r}")
    return value


def make_request(
    *,
    model: str,
    availability: Mapping[GpuZone, int] | Mapping[tuple, int],
    objective: str | Objective = Objective.THROUGHPUT,
    global_batch_size: int | None = None,
    max_usd_per_iteration: float | None = None,
    max_usd_per_hour: float | None = None,
    min_throughput_samples_per_s: float | None = None,
    top_n: int = 5,
    **knobs,
) -> PlanRequest:
    """Validate a planning request; raises InputError/UnknownNameError naming the problem."""
    objective = Objective.parse(objective)
    model = resolve_model(model)  # a catalog name or a Hugging Face model folder
    clean: dict[GpuZone, int] = {}
    for key, count in dict(availability).items():
        gpu, zone = key
        gpu = normalize_gpu_name(gpu)
        parse_zone(zone)
        if int(count) != count or count < 0:
            raise InputError(f"GPU count for {gpu}@{zone} must be a non-negative integer, got {count!r}")
        if count:
            clean[(gpu, zone)] = clean.get((gpu, zone), 0) + int(count)
    if not clean:
        raise InputError("no GPUs available: give at least one GPU type and zone with a positive count")
    gbs = DEFAULT_GLOBAL_BATCH_SIZE if global_batch_size is None else int(global_batch_size)
    if gbs < 1:
        raise InputError(f"global batch size must be positive, got {global_batch_size!r}")
    if int(top_n) < 1:
        raise InputError(f"--top must be at least 1, got {top_n!r}")
    mbs = knobs.get("micro_batch_sizes")
    if mbs is not None and (not mbs or any(int(b) < 1 for b in mbs)):
        raise InputError(f"micro-batch sizes must be positive, got {mbs!r}")
    levers = knobs.get("memory_levers", DEFAULT_MEMORY_LEVERS)
    if levers not in MEMORY_LEVER_MODES:
        raise InputError(f"memory levers must be one of {', '.join(MEMORY_LEVER_MODES)}; got {levers!r}")
    get_model(model)  # existence already checked; keeps one failure point for aliases
    return PlanRequest(
        model=model,
        availability=dict(sorted(clean.items())),
        objective=objective,
        global_batch_size=gbs,
        max_usd_per_iteration=_positive_or_none(max_usd_per_iteration, "max USD per iteration"),
        max_usd_per_hour=_positive_or_none(max_usd_per_hour, "max USD per hour"),
        min_throughput_samples_per_s=_positive_or_none(min_throughput_samples_per_s, "min throughput"),
        top_n=int(top_n),
        **knobs,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanQuery:
    """What a caller asks the planner on each availability it offers (a PlanRequest less the
    availability): the controller's planner (``controller.planner_plan_fn``) takes one."""

    model: str
    global_batch_size: int | None = None
    objective: Objective = Objective.THROUGHPUT
    max_usd_per_hour: float | None = None
    min_throughput_samples_per_s: float | None = None
    spot: bool = True
    search: SearchSettings = SearchSettings()

    def on(self, availability: Mapping[GpuZone, int]) -> PlanRequest:
        """The request on ``availability``, validated (``make_request``)."""
        search = {f.name: getattr(self.search, f.name) for f in dataclasses.fields(SearchSettings)}
        return make_request(model=self.model, availability=availability, objective=self.objective,
                            global_batch_size=self.global_batch_size, max_usd_per_hour=self.max_usd_per_hour,
                            min_throughput_samples_per_s=self.min_throughput_samples_per_s, spot=self.spot, **search)


__all__ = [
    "DEFAULT_GLOBAL_BATCH_SIZE",
    "GpuZone",
    "PlanQuery",
    "PlanRequest",
    "SearchSettings",
    "UnknownNameError",
    "make_request",
    "parse_gpu_list",
]
