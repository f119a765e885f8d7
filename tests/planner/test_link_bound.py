"""The search's link figure (``bounds.link_s``, ``SegmentParts.link_s``) is a lower bound of every
link fastsim charges between two stages, so the bounds built on it (``bounds.link_lb``,
``steady_links_s``, ``warm_up_with_links_s``, the joint and pipeline-line bounds, ``searcher``'s
ideal iteration) stay below the simulated time of every plan they cover.

Each of those bounds is proven for links of *at least* ``l`` (their algebra is checked against the
1F1B schedule in test_bounds.py); what is checked here is that premise, on the AE rows whose pools
span zones (the geo rows: five zones; floor and cap: two) and the completeness scenarios: every
boundary fastsim times during the search (its slowest replica pair is what it charges) is at least
the link bound of the two stages' types over the request's zones; and no evaluated plan's
simulated iteration beats its shape's link steady-state bound (``bounds.link_lb``) or the whole
iteration bound its shape was queued with (``ShapeBounds.time_lb``: capacity, links, warm-up,
blocked sends, sync, the joint bound).  (Shapes pruned unevaluated are not simulated here: their
bounds rest on the same premise, checked above.)

A one-segment shape's blocked bound takes, per boundary, the tighter link of the zones its placed
replicas route through (``SegmentParts.placed_links``): every boundary of every evaluated
one-segment plan (polish trials included) is checked against the link fastsim charged it."""

import importlib.util
from pathlib import Path

import pytest

import sailor_core.planner.fastsim as fastsim
import sailor_core.planner.search as search
import sailor_core.planner.search.shape_bound as shape_bound
from sailor_core.planner import kinds, make_request, plan_job
from sailor_core.planner.search import bounds
from tests.planner.test_completeness import MIXED, SCENARIOS

ROOT = Path(__file__).resolve().parents[2]

def _ae_request(label: str):
    # The rows exactly as bench_planner_ae.py builds them (its trace rows, batch and limits).
    spec = importlib.util.spec_from_file_location("bench_planner_ae", ROOT / "benchmarks" / "bench_planner_ae.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    name, row = next((n, r) for lab, n, r in bench.rows() if lab == label)
    return bench._request(name, row)


REQUESTS = {
    **{label: label for label in ("geo 0", "geo 1", "geo 2", "floor", "cap")},
    **{name: kw for name, (_, kw) in SCENARIOS.items()},
    **{name: kw for name, kw in MIXED.items() if "two zones" in name},
}


def _request(name: str):
    spec = REQUESTS[name]
    if isinstance(spec, str):
        return _ae_request(spec)
    return make_request(max_stages=2, **({"mixed_stages": False} if name in SCENARIOS else {}), **spec)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_link_fastsim_charges_is_at_least_the_link_bound(name, profiles, network, monkeypatch):
    req = _request(name)
    zones: dict[str, dict[str, int]] = {}
    for (gpu, zone), n in req.availability.items():
        zones.setdefault(gpu, {})[zone] = n
    timed, shapes, queued, charged, now = [], [], {}, [], []
    transfer, evaluate_shape = fastsim.FastSim._transfer_s, search.Searcher.evaluate_shape
    pipeline = fastsim.one_f_one_b_time
    time_lb = shape_bound.ShapeBounds.time_lb

    def spy_transfer(self, nbytes, ends, partitioned):
        t = transfer(self, nbytes, ends, partitioned)
        timed.append((nbytes, ends, t))
        return t

    def spy_pipeline(timings, link_s, *args, **kwargs):
        if now:  # the links fastsim charged the boundaries of a plan of the shape being evaluated
            charged.append((now[-1], tuple(link_s)))
        return pipeline(timings, link_s, *args, **kwargs)

    def spy_shape(self, mbs, shape, tau_lb, prepared=None):
        now.append((self.parts, shape))
        try:
            ev = evaluate_shape(self, mbs, shape, tau_lb, prepared)
        finally:
            now.pop()
        if ev is not None:
            shapes.append((ev, shape, bounds.link_lb(self.req.global_batch_size // mbs, shape, self.parts.link_s)))
        return ev

    def spy_bound(self, space, shape, busiest, known_s):
        out = time_lb(self, space, shape, busiest, known_s)
        queued[shape] = max(queued.get(shape, 0.0), out[2])  # the whole iteration bound it was queued with
        return out

    # fresh process memos (the kinds' caches keep what fastsim timed): a fresh process's search
    monkeypatch.setattr(kinds, "_SHARED", {})
    monkeypatch.setattr(fastsim.FastSim, "_transfer_s", spy_transfer)
    monkeypatch.setattr(search.Searcher, "evaluate_shape", spy_shape)
    monkeypatch.setattr(fastsim, "one_f_one_b_time", spy_pipeline)
    monkeypatch.setattr(shape_bound.ShapeBounds, "time_lb", spy_bound)
    try:
        plan_job(req, profiles=profiles, network=network)
    except Exception as err:  # an infeasible request still times its links
        assert type(err).__name__ == "InfeasibleError", err
    assert timed and shapes
    for nbytes, (ga, ta, za, gb, tb, zb), t in timed:
        least = bounds.link_s(network, nbytes, zones[ga], zones[gb], ga, ta, gb, tb)
        assert least <= t * (1 + 1e-12), (name, ga, ta, za, gb, tb, zb, least, t)
    for ev, shape, link_lb in shapes:
        t = ev.res.iteration_time_s
        assert link_lb <= t * (1 + 1e-9), (name, ev.key, link_lb, t)
        assert queued.get(shape, 0.0) <= t * (1 + 1e-9), (name, ev.key, queued[shape], t)
    assert any(shape in queued for _, shape, _ in shapes)
    placed = raised = 0
    for (parts, shape), links in charged:
        bound = parts.placed_links(shape[0]) if len(shape) == 1 else None
        if bound is None:
            continue
        assert len(bound) == len(links), (name, shape)
        for b, t in zip(bound, links):
            assert b <= t * (1 + 1e-12), (name, shape[0], bound, links)
        placed += 1
        raised += max(bound) > parts.link_s(shape[0], shape[0]) * 1.05
    if isinstance(REQUESTS[name], str):  # every AE row evaluates some, some above the least link
        assert placed and raised, (name, placed, raised)


def test_link_bound_is_the_least_over_the_zone_pairs_not_a_shared_zone(network):
    # In the shipped measurements the link inside one zone can be ~20 % slower than inside another
    # (and slower than some between two zones): a shared zone's link is no bound.
    from sailor_core.simulator.stage import boundary_transfer_s, endpoint

    a100, zs = "A100-40", ("us-central1-a", "us-central1-b", "us-central1-c", "us-west1-b")
    nbytes = 1 << 20
    each = {(za, zb): boundary_transfer_s(network, nbytes, endpoint(za, a100, 2), endpoint(zb, a100, 2))
            for za in zs for zb in zs}
    pools = dict.fromkeys(zs, 8)
    assert bounds.link_s(network, nbytes, pools, pools, a100, 2, a100, 2) == min(each.values())
    assert min(each.values()) < each[(zs[0], zs[0])]  # the first shared zone's is not the least


def test_replica_pairs_follow_the_runs_of_both_stages():
    # Replica j of one stage sends to replica j of the next: runs a a a b b against a a c c c.
    from sailor_core.planner.search.parts import _replica_pairs

    pairs = _replica_pairs((("a", 3), ("b", 2)), (("a", 2), ("c", 3)))
    assert pairs == (("a", "a"), ("a", "c"), ("b", "c"))
    assert _replica_pairs((("z", 4),), (("z", 4),)) == (("z", "z"),)
