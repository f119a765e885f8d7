import pytest


@pytest.fixture(scope="session")
def profiles():
    from sailor_core.profiles import default_profile_db

    return default_profile_db()


@pytest.fixture(scope="session")
def network():
    from sailor_core.network.model import default_network

    return default_network()


@pytest.fixture
def search_spies(monkeypatch):
    """Spies on the searches a test runs, with fresh kind memos (every plan timed anew):
    ``current["shape"]`` is (searcher, micro-batch size, shape) while that shape is evaluated, and
    ``works[(id(searcher), micro-batch size)]`` the reference work its shapes were scored with."""
    import sailor_core.planner.search as search
    import sailor_core.planner.search.spaces as spaces
    from sailor_core.planner import kinds

    current, works = {}, {}
    evaluate_shape, score = search.Searcher.evaluate_shape, spaces.score_shapes

    def spy_shape(self, mbs, shape, tau_lb, prepared=None):
        current["shape"] = (self, mbs, shape)
        try:
            return evaluate_shape(self, mbs, shape, tau_lb, prepared)
        finally:
            current.pop("shape")

    def spy_score(searcher, present, **kw):
        works[(id(searcher), kw["mbs"])] = kw["work_s"]
        return score(searcher, present, **kw)

    monkeypatch.setattr(spaces, "score_shapes", spy_score)
    monkeypatch.setattr(kinds, "_SHARED", {})
    monkeypatch.setattr(search.Searcher, "evaluate_shape", spy_shape)
    return current, works
