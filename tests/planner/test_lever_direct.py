"""A ``pays`` rung with few shapes that can pay is searched over those alone
(``levers.search_rung_directly``): it finds the lever plans the rung's short search finds, and where
that search's patience runs out first, what it missed."""

from sailor_core.plan.types import RECOMPUTE_SELECTIVE
from sailor_core.planner import levers, make_request, plan_job

A, ZA = "A100-40", "us-central1-a"


def _runs(monkeypatch, direct: bool) -> list:
    """Whether each rung was walked directly; ``direct`` False: never (the rung's short search)."""
    walked = []
    orig = levers.search_rung_directly

    def spied(*args):
        sub = orig(*args) if direct else None
        walked.append(sub is not None)
        return sub

    monkeypatch.setattr(levers, "search_rung_directly", spied)
    return walked


def _answer(result) -> list:
    return [(c.plan, c.sim.throughput_samples_per_s, c.notes) for c in result.candidates]


def _walked_and_searched(monkeypatch, request):
    """(whether each rung was walked, the answer with the direct walk, the answer without it)."""
    walked = _runs(monkeypatch, direct=True)
    direct = plan_job(request)
    with monkeypatch.context() as m:
        _runs(m, direct=False)
        searched = plan_job(request)
    return walked, direct, searched


def test_direct_walk_finds_the_lever_plan_the_rung_search_finds(monkeypatch):
    # opt-350m on 16 A100-40: micro-batches of 8 over one stage fit only with recomputation
    request = make_request(model="opt-350m", availability={(A, ZA): 16}, global_batch_size=256)
    walked, direct, searched = _walked_and_searched(monkeypatch, request)
    assert walked == [True] * len(levers.PAYS_RUNGS)
    assert any(s.recompute == RECOMPUTE_SELECTIVE for c in direct.candidates for s in c.plan.stages)
    assert _answer(direct) == _answer(searched)


def test_direct_walk_is_complete_where_the_rung_search_stops_at_its_patience(monkeypatch):
    # opt-350m on 2 L4: the rung's short search stops before the shape whose plan, relaxed, holds
    # two replicas with ZeRO-2 and no recomputation
    request = make_request(model="opt-350m", availability={("L4", "us-central1-b"): 2}, global_batch_size=1024,
                           top_n=3)
    walked, direct, searched = _walked_and_searched(monkeypatch, request)
    assert True in walked
    ranked = sorted((c.sim.throughput_samples_per_s for c in direct.candidates), reverse=True)
    ranked_searched = sorted((c.sim.throughput_samples_per_s for c in searched.candidates), reverse=True)
    assert len(ranked) >= len(ranked_searched)
    assert all(a >= b * (1 - 1e-9) for a, b in zip(ranked, ranked_searched))
    assert ranked[0] > ranked_searched[0]


def test_many_shapes_fall_back_to_the_rung_search(monkeypatch):
    # none allowed: a rung with a shape that can pay is searched (one with none is walked, at no cost)
    request = make_request(model="opt-350m", availability={(A, ZA): 16}, global_batch_size=256)
    monkeypatch.setattr(levers, "DIRECT_MAX_SHAPES", 0)
    walked, fallen, searched = _walked_and_searched(monkeypatch, request)
    assert False in walked
    assert _answer(fallen) == _answer(searched)


def _scanned(monkeypatch) -> list:
    """Per ``pays`` rung scan: (its candidates as scanned, the same scan's with no faster rung's
    rulings, entries it skipped on those rulings)."""
    scans = []
    orig = levers._rung_candidates

    def both(searcher, kinds, bounds, rung):
        ruled = searcher.memos.model.rung_scans
        faster = dict(ruled)
        ruled.clear()
        every = orig(searcher, kinds, bounds, rung)
        ruled.clear()
        ruled.update(faster)
        skipping = levers._ruled_out_by_faster(searcher, rung)
        scans.append((_figures(orig(searcher, kinds, bounds, rung)), _figures(every), len(skipping)))
        return every

    monkeypatch.setattr(levers, "_rung_candidates", both)
    return scans


def _figures(queue) -> list | None:
    """A candidate heap's figures (its shapes' segments are built afresh by each scan)."""
    if queue is None:
        return None
    return [(score, tie, g, t_lb, space.mbs, placed, sync_s,
             [(s.gpu, s.tp_degree, s.dp_degree, s.num_stages, s.rule, s.capacity, s.slowness, s.block_busy_s,
               s.head_busy_s) for s in shape])
            for score, tie, g, _, (t_lb, space, shape, placed, sync_s) in sorted(queue)]


def test_a_slower_rung_skips_only_shapes_it_cannot_keep(monkeypatch):
    # full recomputation after selective (both ZeRO-2): the shapes selective's scan bounded past its
    # limit are not bounded again, and the full rung keeps the candidates a scan of every shape keeps,
    # where it has none (opt-350m on 16 A100-40) and where it has some (opt-2.7b on 8 A100-40)
    skipped = 0
    for model, gpus, batch in (("opt-350m", 16, 256), ("opt-2.7b", 8, 256)):
        scans = _scanned(monkeypatch)
        plan_job(make_request(model=model, availability={(A, ZA): gpus}, global_batch_size=batch, top_n=5))
        assert len(scans) == len(levers.PAYS_RUNGS)
        for got, every, _ in scans:
            assert got == every
        skipped += scans[-1][2]
        if model == "opt-2.7b":
            assert scans[-1][1]  # (the full rung has candidates there)
    assert skipped > 0
