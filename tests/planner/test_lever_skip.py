"""The ``pays`` lever rungs (``levers.PAYS_RUNGS``) are not searched where they cannot pay
(``levers.cannot_pay``: no shape that the search without levers could not fit freely can, on the
rung's memory, beat the plans found), with the same answer as searching them; and they are
searched, and find the lever plan, where they can pay.  ``cannot_pay`` decides where the direct
walk (``levers.search_rung_directly``) does not apply (more shapes can pay than it walks): the
tests here take that path; where the walk applies, a rung that cannot pay leaves it nothing to
evaluate."""

import pytest

from sailor_core.plan.types import RECOMPUTE_NONE
from sailor_core.planner import api, levers, make_request, plan_job

A, ZA, ZB = "A100-40", "us-central1-a", "us-central1-b"

# A small model on GPUs with memory to spare: no shape is ruled out for memory.
ROOMY = {
    "one zone": dict(model="small", availability={(A, ZA): 7}, global_batch_size=315),
    "two zones": dict(model="small", availability={(A, ZA): 4, (A, ZB): 4}, global_batch_size=64),
}


_CANNOT_PAY, _SEARCH_RUNG, _DIRECTLY = levers.cannot_pay, api._search_rung, levers.search_rung_directly


def _spy(monkeypatch, decide=None, walk: bool = False) -> tuple[list, list]:
    """(each rung's cannot_pay answer, each rung's short search run), ``decide`` replacing the
    answer; ``walk`` False: the direct walk never applies."""
    answers, runs = [], []
    cannot_pay, search_rung, directly = _CANNOT_PAY, _SEARCH_RUNG, _DIRECTLY

    def spied(searcher, rung):
        answers.append(cannot_pay(searcher, rung) if decide is None else decide)
        return answers[-1]

    def searched(*args):
        runs.append(args)
        return search_rung(*args)

    monkeypatch.setattr(levers, "cannot_pay", spied)
    monkeypatch.setattr(api, "_search_rung", searched)
    monkeypatch.setattr(levers, "search_rung_directly", directly if walk else lambda *args: None)
    return answers, runs


def _answer(result) -> list:
    return [(c.plan, c.sim.throughput_samples_per_s, c.sim.usd_per_iteration, c.notes) for c in result.candidates]


@pytest.mark.parametrize("name", sorted(ROOMY))
def test_rungs_are_not_searched_where_they_cannot_pay(monkeypatch, name):
    request = make_request(**ROOMY[name])
    answers, runs = _spy(monkeypatch)
    skipped = plan_job(request)
    assert answers == [True] * len(levers.PAYS_RUNGS) and not runs
    with monkeypatch.context() as m:
        _, runs = _spy(m, decide=False)
        searched = plan_job(request)
    assert len(runs) == len(levers.PAYS_RUNGS)
    assert _answer(skipped) == _answer(searched)
    assert (skipped.exhausted, skipped.searched_dp_degrees) == (searched.exhausted, searched.searched_dp_degrees)
    with monkeypatch.context() as m:
        answers, runs = _spy(m, walk=True)
        subs = []
        m.setattr(levers, "search_rung_directly", lambda *args: subs.append(_DIRECTLY(*args)) or subs[-1])
        walked = plan_job(request)
    assert not answers and not runs and len(subs) == len(levers.PAYS_RUNGS)
    assert all(sub.stats.num_splits == sub.stats.num_shapes == 0 for sub in subs)  # nothing to walk
    assert _answer(walked) == _answer(skipped)


def test_rungs_are_searched_and_find_the_lever_plan_where_they_can_pay(monkeypatch):
    # opt-350m on 16 A100-40: micro-batches of 8 over one stage fit only with recomputation
    # (a plan within 2 % of the best, second of the top 5)
    request = make_request(model="opt-350m", availability={(A, ZA): 16}, global_batch_size=256)
    answers, runs = _spy(monkeypatch)
    result = plan_job(request)
    assert False in answers and runs
    levered = [c for c in result.candidates if any(s.recompute != RECOMPUTE_NONE for s in c.plan.stages)]
    assert levered and all(c.notes for c in levered)
    with monkeypatch.context() as m:
        _spy(m, decide=True)
        without = plan_job(request)
    # without the rung searches that plan is not found: they paid
    assert not any(s.recompute != RECOMPUTE_NONE for c in without.candidates for s in c.plan.stages)
    assert result.candidates[0].plan == without.candidates[0].plan
