"""A search answers the same whatever ran before it in the process: the process's memos (the
shared kinds of ``kinds.shared_kind_cache`` and what hangs on them) change what is recomputed,
never a plan, a figure or the count of evaluations.

The shared kinds are kept in a bounded dict, emptied when full; the fill level depends on the
requests planned before.  A search that fetched a lever setting's kinds again after the dict was
emptied got new Kind objects (kinds compare by identity), so its memos took plans it had already
evaluated for new ones: ``num_evaluated`` 342 instead of 332 on the golden "opt-350m |
homogeneous row 1" after two other searches (``levers.lever_kinds`` now holds one cache per
setting for the whole search)."""

import pytest

import sailor_core.planner.kinds as kinds_mod
from sailor_core.planner import make_request, plan_job
from sailor_core.profiles.db import load_profile_db
from sailor_core.profiles.store import SHIPPED_DIR, profile_files

A, V = "A100-40", "V100-16"
ZA, ZB = "us-central1-a", "us-central1-b"


def _fresh_profiles():
    # A new database object: new shared kinds, so empty process memos (as in a new process).
    return load_profile_db(profile_files(SHIPPED_DIR))


def _answer(result) -> dict:
    """Everything the answer says (plans, figures, counts, flags) but the time it took."""
    return {k: v for k, v in result.to_dict().items() if k != "search_time_s"}


class _AlwaysFull(dict):
    """The shared kinds' dict at its worst: emptied before every new entry."""

    def __len__(self) -> int:
        return 1 << 30


def _request():
    return make_request(model="opt-350m", availability={(A, ZA): 80}, global_batch_size=1024)


def _other_searches(network):
    profiles = _fresh_profiles()
    for model, avail in (("opt-350m", {(A, ZA): 32, (V, ZA): 48}),
                         ("gpt-neo-2.7b", {(A, ZA): 24, (V, ZA): 24, (V, ZB): 16})):
        plan_job(make_request(model=model, availability=avail, global_batch_size=512),
                 profiles=profiles, network=network)


@pytest.mark.parametrize("before", ["other searches", "shared kinds dropped at every fetch"])
def test_a_search_answers_as_in_a_fresh_process(before, network, monkeypatch):
    monkeypatch.setattr(kinds_mod, "_SHARED", {})
    fresh = _answer(plan_job(_request(), profiles=_fresh_profiles(), network=network))
    monkeypatch.setattr(kinds_mod, "_SHARED", {})
    if before == "other searches":
        _other_searches(network)  # fills the shared dict nearly full: emptied during the next search
    else:
        monkeypatch.setattr(kinds_mod, "_SHARED", _AlwaysFull())
    again = _answer(plan_job(_request(), profiles=_fresh_profiles(), network=network))
    assert again["num_evaluated"] == fresh["num_evaluated"]
    assert again == fresh  # the same plans, figures and flags
