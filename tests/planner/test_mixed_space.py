"""The bounded walk of the mixed space (``planner/mixed_space.py``): its bound never exceeds a
plan's simulated iteration time, its micro-batch counts follow the routing rule, and it says
when it did not cover the space."""

import itertools

import pytest

from sailor_core.plan.routing import replica_of
from sailor_core.planner import make_request
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.mixed_space import (MAX_MIXED_GPUS, bound_s, busiest_counts, in_plan_regime, rent_s,
                                             search_mixed, stage_groups, stage_options)
from sailor_core.planner.search import Searcher

A, V = "A100-40", "V100-16"
ZA, ZB = "us-central1-a", "us-central1-b"


@pytest.mark.parametrize("kw", [
    dict(model="small", availability={(A, ZA): 1, (V, ZA): 2}, global_batch_size=1024),
    dict(model="opt-350m", availability={(A, ZA): 1, (V, ZB): 2}, global_batch_size=16, micro_batch_sizes=(1, 2),
         spot=False),
])
def test_the_bounds_never_exceed_the_simulated_iteration_and_cost(kw, profiles, network):
    s = Searcher(make_request(max_stages=2, **kw), profiles=profiles, network=network)
    L = s.num_layers
    count = 0
    for mbs in s.micro_batch_sizes():
        num_mb = s.req.global_batch_size // mbs
        for num_stages in (1, 2):
            for groups in stage_groups(stage_options(s, mbs), dict(s.req.availability), num_stages, num_mb):
                groups = in_plan_regime(s, groups)
                for cuts in itertools.islice(itertools.combinations(range(1, L), num_stages - 1), 0, None, 3):
                    ends = [*cuts, L]
                    stages = tuple(FastStage(a, b, g) for a, b, g in zip((0, *cuts), ends, groups))
                    res = s.evaluate(mbs, stages).res
                    b = bound_s(groups, ends, num_mb)
                    assert b <= res.iteration_time_s * (1 + 1e-9)
                    assert rent_s(s, groups) * b <= res.usd_per_iteration * (1 + 1e-9)
                    count += 1
    assert count > 100


def test_busiest_counts_follow_the_routing_rule(profiles, network):
    s = Searcher(make_request(model="small", availability={(A, ZA): 1, (V, ZA): 2}, global_batch_size=1024),
                 profiles=profiles, network=network)
    ka, kv = s.kinds.get(A, 1, 1), s.kinds.get(V, 1, 1)
    for groups in [((ka, ZA, 1), (kv, ZA, 2)), ((kv, ZA, 2), (ka, ZA, 1)), ((kv, ZA, 1), (ka, ZA, 1), (kv, ZA, 1))]:
        for num_mb in (1, 2, 3, 1024, 1025):
            d = sum(n for _, _, n in groups)
            counts = [sum(1 for m in range(num_mb) if replica_of(m, d) == r) for r in range(d)]
            pos, want = 0, []
            for k, _, n in groups:
                want.append((k, max(counts[pos:pos + n])))
                pos += n
            assert busiest_counts(groups, num_mb) == tuple(want)


def test_the_walk_says_when_it_did_not_cover_the_space(profiles, network):
    small = dict(model="small", availability={(A, ZA): 1, (V, ZA): 2}, global_batch_size=1024, max_stages=2)
    assert search_mixed(Searcher(make_request(**small), profiles=profiles, network=network))
    # out of budget: no proof
    assert not search_mixed(Searcher(make_request(**small), profiles=profiles, network=network), max_checks=10)
    assert not search_mixed(Searcher(make_request(**small), profiles=profiles, network=network), max_evaluations=3)
    # pools beyond the walk's reach are not walked
    big = make_request(model="small", availability={(A, ZA): MAX_MIXED_GPUS + 1}, global_batch_size=1024)
    s = Searcher(big, profiles=profiles, network=network)
    assert not search_mixed(s) and s.stats.num_evaluated == 0
