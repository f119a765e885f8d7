"""The planner's memory levers (issue 34): searched in full when nothing fits without them, and
where plans fit only where they pay (the default, ``pays``), kept off where they do not,
explained, and agreeing with ``simulate``."""

import random

import pytest

from sailor_core.errors import InfeasibleError, InputError
from sailor_core.planner import make_request, plan_job
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.kinds import LEVER_LADDER, shared_kind_cache
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.simulator import simulate
from sailor_core.specs.plan import PlanSpec

BIG = {("V100-16", "us-central1-a"): 32}  # llama-3-8b fits nowhere on these without a lever


def _request(levers, availability=BIG, model="llama-3-8b"):
    return make_request(model=model, availability=availability, global_batch_size=64, top_n=1,
                        memory_levers=levers)


def test_a_model_too_big_for_the_gpus_gets_a_plan_with_levers():
    with pytest.raises(InfeasibleError, match="does not fit"):
        plan_job(_request("off"))
    result = plan_job(_request("when-needed"))
    cand = result.candidates[0]
    levered = [s for s in cand.plan.stages if s.recompute != "none" or s.zero_stage]
    assert levered and cand.sim.fits and result.num_disagreements == 0
    # each lever kept is explained: without it the stage does not fit, or the plan is worse
    assert len(cand.notes) >= len(levered)
    for note in cand.notes:
        assert note.startswith("stage ") and ("GB >" in note or "faster" in note)
    # simulate reads the same levers from the plan (its file round trip: tests/simulator/test_levers.py)
    assert simulate(cand.plan).iteration_time_s == pytest.approx(cand.sim.iteration_time_s, rel=1e-12)


def test_when_needed_leaves_a_plan_that_fits_without_levers_unchanged():
    small = {("A100-40", "us-central1-a"): 8}
    off = plan_job(_request("off", small, "opt-350m")).candidates[0]
    when_needed = plan_job(_request("when-needed", small, "opt-350m")).candidates[0]
    assert when_needed.plan == off.plan and not when_needed.notes
    assert all(s.recompute == "none" and s.zero_stage == 0 for s in when_needed.plan.stages)


@pytest.mark.parametrize("model, pool", [
    ("opt-2.7b", {("T4", "us-central1-a"): 16}),  # ZeRO-1 lets two stages run micro-batches of 2
    ("opt-2.7b", {("V100-16", "us-central1-a"): 16}),  # selective recomputation: PP2 instead of PP4
    ("opt-350m", {("A100-40", "us-central1-a"): 8}),  # fits easily: no lever pays
])
def test_the_default_keeps_levers_only_where_they_pay(model, pool):
    off = plan_job(_request("off", pool, model)).candidates[0]
    result = plan_job(_request("pays", pool, model))
    best = result.candidates[0]
    assert result.num_disagreements == 0
    assert best.sim.throughput_samples_per_s >= off.sim.throughput_samples_per_s
    levered = [s for s in best.plan.stages if s.recompute != "none" or s.zero_stage]
    if not levered:
        assert best.plan == off.plan and not best.notes
        return
    # a lever on a plan that fits without levers is there because the plan is faster with it
    assert best.sim.throughput_samples_per_s > off.sim.throughput_samples_per_s
    assert len(best.notes) == sum((s.recompute != "none") + bool(s.zero_stage) for s in levered)
    for note in best.notes:
        assert "GB >" in note or ("faster" in note and "with it +" in note)


def test_pays_is_the_default():
    assert make_request(model="opt-350m", availability={("A100-40", "us-central1-a"): 1}).memory_levers == "pays"
    assert PlanSpec(model="opt-350m", gpus="A100-40@us-central1-a=1").memory_levers == "pays"


def test_bad_lever_mode_is_one_clear_error():
    with pytest.raises(InputError, match="memory levers"):
        _request("sometimes")
    with pytest.raises(InputError, match="--memory-levers"):
        PlanSpec(model="opt-350m", gpus="A100-40@us-central1-a=1", memory_levers="sometimes")


def test_always_lets_levers_compete_and_keeps_them_only_where_they_pay():
    pool = {("V100-16", "us-central1-a"): 8, ("A100-40", "us-central1-a"): 4}  # mixed types
    off = plan_job(_request("off", pool, "opt-2.7b")).candidates[0]
    result = plan_job(_request("always", pool, "opt-2.7b"))
    best = result.candidates[0]
    assert result.num_disagreements == 0  # fastsim's lever figures are simulate's
    assert best.sim.throughput_samples_per_s >= off.sim.throughput_samples_per_s
    levered = [s for s in best.plan.stages if s.recompute != "none" or s.zero_stage]
    assert len(best.notes) == sum((s.recompute != "none") + bool(s.zero_stage) for s in levered)


def test_too_big_even_with_levers_says_so():
    # 8 V100-16 hold 128 GB: llama-3-8b's 16 B per parameter do not fit without replicas to shard over
    with pytest.raises(InfeasibleError, match="nor with ZeRO and activation recomputation"):
        plan_job(_request("when-needed", {("V100-16", "us-central1-a"): 8}))


def test_fastsim_matches_simulate_on_random_plans_with_levers(profiles, network):
    # Random stages over mixed GPU types, TP degrees and zones, each stage on kinds of a random
    # lever setting (as a lever search or relax builds them): fastsim's figures are simulate's.
    rng = random.Random(34)
    model = "gpt-neo-2.7b"
    req = make_request(model=model, availability={("A100-40", "us-central1-a"): 8}, global_batch_size=256)
    s = Searcher(req, profiles=profiles, network=network)
    settings = [("none", 0), *LEVER_LADDER]
    kinds = [("A100-40", 1), ("A100-40", 2), ("V100-16", 1), ("V100-16", 4)]
    zones = ["us-central1-a", "us-central1-b", "us-west1-b"]
    for _ in range(30):
        mbs = rng.choice([1, 2])
        ends = [*sorted(rng.sample(range(1, s.num_layers), rng.randint(0, 3))), s.num_layers]
        stages, start = [], 0
        for end in ends:
            cache = shared_kind_cache(model, None, None, profiles, rng.choice(settings))
            groups = [(cache.get(*rng.choice(kinds), mbs), rng.choice(zones), rng.randint(1, 4))
                      for _ in range(rng.randint(1, 3))]
            stages.append(FastStage(start, end, tuple(groups)))
            start = end
        res = s.fast.evaluate(mbs, stages)
        plan = s.to_plan(Evaluated(score=0.0, mbs=mbs, stages=tuple(stages), res=res, feasible=True))
        sim = simulate(plan, profiles=profiles, network=network)
        assert res.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-9)
        assert res.usd_per_iteration == pytest.approx(sim.usd_per_iteration, rel=1e-9)
        assert res.peak_memory_bytes == sim.peak_memory_bytes and res.fits == sim.fits


def test_lever_searches_share_what_the_levers_leave_unchanged_and_answer_the_same():
    """Rings, placements and the network's figures are computed once for every lever setting of a
    model (``KindCache.family_extras``): a lever search after another request's plain search
    answers, plan and count, as one in a process that planned nothing before."""
    from sailor_core.planner import kinds
    from sailor_core.profiles import default_profile_db

    pool = {("V100-16", "us-central1-a"): 16}  # selective recomputation: PP2 instead of PP4
    req = _request("pays", pool, "opt-2.7b")
    kinds._SHARED.clear()
    fresh = plan_job(req)
    kinds._SHARED.clear()
    plan_job(_request("off", pool, "opt-2.7b"))  # the plain kinds and their memos, filled
    warm = plan_job(req)
    assert [c.plan for c in warm.candidates] == [c.plan for c in fresh.candidates]
    assert any(s.recompute != "none" for s in warm.candidates[0].plan.stages)
    assert warm.num_evaluated == fresh.num_evaluated
    db = default_profile_db()
    plain = shared_kind_cache(req.model, req.seq_len, req.regime, db)
    for levers in LEVER_LADDER:
        assert shared_kind_cache(req.model, req.seq_len, req.regime, db, levers).family_extras is plain.extras


@pytest.mark.parametrize("model, gpu", [("opt-350m", "A100-40"), ("gpt-neo-2.7b", "A100-40"), ("opt-2.7b", "T4")])
def test_a_split_memory_never_limited_is_the_split_time_alone_gives(model, gpu, profiles):
    # The premise of the lever searches' skip (levers.py): where min_max_split reports no memory
    # hit, the same kinds with unlimited memory split no better (to its tolerance), so a lever,
    # which frees memory and adds time, cannot balance that shape better.
    import dataclasses

    from sailor_core.planner.split import StageSlot, busiest_s, min_max_split
    from sailor_core.simulator.memory import inflight_microbatches

    cache = shared_kind_cache(model, None, None, profiles)
    rng = random.Random(35)
    free_seen = limited_seen = 0
    for _ in range(60):
        mbs = rng.choice([1, 2, 4, 8])
        kind = cache.get(gpu, rng.choice([1, 2, 4]), mbs)
        if kind is None:
            continue
        unlimited = dataclasses.replace(kind, capacity_bytes=10 ** 18, max_end_memo={})
        num_stages, num_mb = rng.randint(2, 8), rng.choice([8, 32, 128])
        n = -(-num_mb // rng.choice([1, 2, 4]))
        slots = [StageSlot(kind=kind, num_microbatches=n, num_inflight=inflight_microbatches(i, num_stages, n))
                 for i in range(num_stages)]
        free = [dataclasses.replace(s, kind=unlimited) for s in slots]
        hits: list[int] = []
        ends = min_max_split(slots, kind.num_layers, memory_hits=hits)
        assert ends == min_max_split(slots, kind.num_layers)  # reporting changes nothing
        free_ends = min_max_split(free, kind.num_layers)
        if ends is None:  # nothing fits (a memory failure of its own)
            continue
        if hits:
            limited_seen += 1
        else:
            free_seen += 1
            assert busiest_s(slots, ends) <= busiest_s(free, free_ends) * (1 + 1e-2)
    assert free_seen >= 10 and limited_seen >= 5


def test_pays_lever_searches_skip_shapes_that_fit_freely_and_answer_the_same(monkeypatch):
    """``pays``' short rung searches skip the shapes the search without levers fitted with memory
    limiting neither split nor polish: the same plans (the lever-only one, one stage of micro-batches
    of 16 under selective recomputation and ZeRO-2, among them), fewer evaluations."""
    from sailor_core.planner import kinds, levers

    req = make_request(model="opt-350m", availability={("A100-40", "us-central1-a"): 128}, global_batch_size=1024)
    kinds._SHARED.clear()
    skipping = plan_job(req)
    monkeypatch.setattr(levers, "may_search_pays_rungs", lambda _req: False)  # nothing noted: nothing skipped
    kinds._SHARED.clear()
    full = plan_job(req)
    assert [c.plan for c in skipping.candidates] == [c.plan for c in full.candidates]
    assert any(s.recompute != "none" for c in skipping.candidates for s in c.plan.stages)
    # Under its regime's blocking sends the bound of a segment placed alone (search/alone.py)
    # already proves worse the shapes the skip saved; with a regime that prefetches it does not.
    assert skipping.num_evaluated <= full.num_evaluated
    monkeypatch.undo()
    req = make_request(model="opt-350m", availability={("A100-40", "us-central1-a"): 128}, global_batch_size=1024,
                       regime="torch-fp32-adamw")
    kinds._SHARED.clear()
    skipping = plan_job(req)
    monkeypatch.setattr(levers, "may_search_pays_rungs", lambda _req: False)
    kinds._SHARED.clear()
    full = plan_job(req)
    assert [c.plan for c in skipping.candidates] == [c.plan for c in full.candidates]
    assert skipping.num_evaluated < full.num_evaluated
