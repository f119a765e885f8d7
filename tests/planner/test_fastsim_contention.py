"""The fast path charges a stage's last send sharing the NIC with its DP ring as simulate does."""

import pytest

from sailor_core.planner import make_request
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.simulator import compose, simulate


@pytest.mark.parametrize("tp", [1, 2])
def test_fastsim_agrees_where_sends_share_the_nic(profiles, network, monkeypatch, tp):
    # H200 runs Sailor's engine (prefetching sends, overlapped DP buckets): two stages in two
    # zones, three replicas each, so every stage but the first meets its ring with its last send.
    req = make_request(model="opt-350m", availability={("H200", "us-central1-a"): 8}, global_batch_size=256)
    s = Searcher(req, profiles=profiles, network=network)
    kind = s.kinds.get("H200", tp, 2)
    half = s.num_layers // 2
    stages = [FastStage(0, half, ((kind, "us-central1-a", 3),)),
              FastStage(half, s.num_layers, ((kind, "us-central1-b", 3),))]
    drains = []
    real = compose.drain_contention_s
    monkeypatch.setattr(compose, "drain_contention_s", lambda *a: drains.append(real(*a)) or drains[-1])
    res = s.fast.evaluate(2, stages)
    sim = simulate(s.to_plan(Evaluated(score=0.0, mbs=2, stages=tuple(stages), res=res, feasible=True)),
                   profiles=profiles, network=network)
    assert len(drains) == 2 and drains[0] > 0
    assert drains[0] == pytest.approx(drains[1], rel=1e-12)
    assert res.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-9)
