"""The memory levers in the planner: ZeRO and activation recomputation per stage, where they pay.

The search itself (``search/``) runs on kinds of one lever setting: ``KindCache`` builds every
kind of a search with one (recomputation, ZeRO stage), so its bounds, splits and ``fastsim``
figures are those of that setting, and a bound stays admissible (a lever only adds time to what
the bound reads, or, for ZeRO's sharded step, to what it does not read).  ``plan_job`` first
searches without levers (the plans and search time of every request that fits are as before);
then, under ``memory_levers``:

* ``off``: nothing more;
* ``when-needed`` (the default): only when no plan fitted in memory, it searches again on the
  ladder of settings, cheapest first (``kinds.LEVER_LADDER``: ZeRO-1, selective recomputation
  with ZeRO-1, selective with ZeRO-2, full with ZeRO-2), every rung (a stronger lever can allow
  a shallower pipeline), its plans competing;
* ``always``: every rung is searched and its plans compete with those without levers (search
  time grows 1.2-11x: docs/benchmarks/planner.md).

Each plan found on a rung is then relaxed stage by stage (``relax``): every stage takes the
setting, of those no stronger than its rung (no more recomputation, no higher ZeRO stage), that
scores best while the plan fits, the weakest of equals (ZeRO's sharded optimizer step can be
faster).  ``notes`` says, for the stages
that keep a lever, what they would need without it.
"""

from __future__ import annotations

import dataclasses

from sailor_core.catalog.gpus import get_gpu
from sailor_core.plan.types import RECOMPUTE_MODES, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, Plan
from sailor_core.planner.explain import relaxed
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import LEVER_LADDER, KindCache, shared_kind_cache
from sailor_core.planner.ranking import FASTEST
from sailor_core.planner.search import Evaluated, Searcher, better
from sailor_core.simulator.levers import lever_label
from sailor_core.simulator.simulate import simulate

LEVERS_OFF, LEVERS_WHEN_NEEDED, LEVERS_ALWAYS = "off", "when-needed", "always"
MEMORY_LEVER_MODES = (LEVERS_OFF, LEVERS_WHEN_NEEDED, LEVERS_ALWAYS)
_NO_LEVERS = (RECOMPUTE_NONE, 0)


def rungs_to_search(searcher: Searcher) -> tuple[tuple[str, int], ...]:
    """The lever settings ``plan_job`` searches after the plain search (see the module doc)."""
    req = searcher.req
    if req.memory_levers == LEVERS_OFF:
        return ()
    if req.memory_levers == LEVERS_WHEN_NEEDED:
        if searcher.stats.any_fits:
            return ()  # a plan fits: a cap or a floor, not memory, rules plans out
        limited = req.has_cost_caps or req.min_throughput_samples_per_s is not None
        # the limits may have pruned every shape before one was simulated: the search without
        # them says whether anything fits (memoised: why_infeasible asks it too)
        if limited and relaxed(searcher, FASTEST, keep_caps=False, keep_floor=False) is not None:
            return ()
    return LEVER_LADDER


def lever_kinds(searcher: Searcher, levers: tuple[str, int]) -> KindCache:
    req = searcher.req
    return shared_kind_cache(req.model, req.seq_len, req.regime, searcher.profiles, levers)


def relax(searcher: Searcher, ev: Evaluated) -> Evaluated:
    """``ev`` with each stage on the weakest lever setting that keeps the plan fitting, unless a
    stronger one up to its own scores better (see the module doc)."""
    stage_levers = [_levers_of(s) for s in ev.stages]
    if all(lv == _NO_LEVERS for lv in stage_levers):
        return ev
    best = ev
    for i, stage in enumerate(ev.stages):
        top = stage_levers[i]
        options = _weaker_or_equal(top) if top != _NO_LEVERS else []
        chosen = None
        for levers in options:
            moved = _with_levers(searcher, stage, levers)
            if moved is None:
                continue
            stages = list(best.stages)
            stages[i] = moved
            trial = searcher.evaluate(best.mbs, tuple(stages))
            if trial.feasible and (chosen is None or better(trial, chosen)):
                chosen = trial
        if chosen is not None:
            best = chosen
    return best


def _weaker_or_equal(levers: tuple[str, int]) -> list[tuple[str, int]]:
    """Every setting with no more recomputation and no higher ZeRO stage than ``levers``,
    weakest first."""
    recompute, zero = levers
    modes = RECOMPUTE_MODES[: RECOMPUTE_MODES.index(recompute) + 1]
    return [(mode, z) for mode in modes for z in range(zero + 1)]


def _levers_of(stage: FastStage) -> tuple[str, int]:
    kind = stage.groups[0][0]
    return kind.recompute, kind.zero_stage


def _with_levers(searcher: Searcher, stage: FastStage, levers: tuple[str, int]) -> FastStage | None:
    """``stage`` with its kinds under ``levers`` (None when a kind has no profile)."""
    kinds = searcher.kinds if levers == _NO_LEVERS else lever_kinds(searcher, levers)
    groups = []
    for kind, zone, n in stage.groups:
        other = kinds.get(kind.gpu, kind.tp_degree, kind.micro_batch_size, searcher.req.regime)
        if other is None:
            return None
        groups.append((other, zone, n))
    return FastStage(stage.layer_start, stage.layer_end, tuple(groups))


def notes(plan: Plan, *, profiles, network, spot: bool) -> tuple[str, ...]:
    """One line per stage that keeps a lever: what it would need without each of its levers."""
    out = []
    for i, stage in enumerate(plan.stages):
        dropped = []
        if stage.recompute != RECOMPUTE_NONE:
            what = "recomputes attention" if stage.recompute == RECOMPUTE_SELECTIVE else "recomputes every block"
            dropped.append((what, _replace_stage(plan, i, recompute=RECOMPUTE_NONE)))
        if stage.zero_stage:
            what = (f"shards its optimizer states over {stage.dp_degree} replicas (ZeRO-1)" if stage.zero_stage == 1
                    else f"shards its optimizer states and gradients over {stage.dp_degree} replicas (ZeRO-2)")
            dropped.append((what, _replace_stage(plan, i, zero_stage=0)))
        for what, without in dropped:
            out.append(f"stage {i} {what}: without it, {_need(without, i, profiles, network, spot)}")
    return tuple(out)


def _replace_stage(plan: Plan, index: int, **changes) -> Plan:
    stages = list(plan.stages)
    stages[index] = dataclasses.replace(stages[index], **changes)
    return dataclasses.replace(plan, stages=tuple(stages))


def _need(plan: Plan, index: int, profiles, network, spot: bool) -> str:
    """What stage ``index`` of ``plan`` needs on its fullest GPU, against that GPU's memory."""
    sim = simulate(plan, profiles=profiles, network=network, spot=spot, validate=False)
    stage = sim.stages[index]
    worst = max(stage.replicas, key=lambda r: r.memory.peak_bytes - r.memory.capacity_bytes)
    mem = worst.memory
    if not mem.fits:
        return f"{mem.peak_bytes / 1e9:.1f} GB > {mem.capacity_bytes / 1e9:.1f} GB on {worst.gpu}"
    return (f"it fits ({mem.peak_bytes / 1e9:.1f} GB of {get_gpu(worst.gpu).memory_bytes / 1e9:.1f} GB on "
            f"{worst.gpu}) but is slower or dearer: {sim.throughput_samples_per_s:.4g} samples/s, "
            f"{sim.usd_per_iteration:.4g} USD/iteration")


__all__ = ["LEVERS_ALWAYS", "LEVERS_OFF", "LEVERS_WHEN_NEEDED", "MEMORY_LEVER_MODES", "lever_kinds",
           "lever_label", "notes", "relax", "rungs_to_search"]
