"""The search's evaluator must give simulate's figures: it is built from the same blocks."""

import random

import pytest

from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.planner import make_request
from sailor_core.simulator import simulate

ZONES = ["us-central1-a", "us-central1-b", "us-west1-b"]


def _random_plan(rng, searcher, kinds, model_layers):
    mbs = rng.choice([1, 2, 4])
    num_stages = rng.randint(1, 4)
    cuts = sorted(rng.sample(range(1, model_layers), num_stages - 1))
    ends = [*cuts, model_layers]
    stages, start = [], 0
    first = None
    for end in ends:
        groups = []
        for _ in range(rng.randint(1, 3)):
            gpu, tp = rng.choice(kinds)
            kind = searcher.kinds.get(gpu, tp, mbs)
            # simulate takes every profile under the first replica's regime: so must the planner.
            first = first or kind
            kind = searcher.kinds.in_regime_of(kind, first)
            groups.append((kind, rng.choice(ZONES), rng.randint(1, 5)))
        stages.append(FastStage(start, end, tuple(groups)))
        start = end
    return mbs, tuple(stages)


@pytest.mark.parametrize("model", ["opt-350m", "gpt-neo-2.7b"])
def test_fastsim_matches_simulate_on_random_plans(model, profiles, network):
    rng = random.Random(7)
    req = make_request(model=model, availability={("A100-40", "us-central1-a"): 8}, global_batch_size=256)
    s = Searcher(req, profiles=profiles, network=network)
    # Sailor-profiled GPUs (Megatron regime) mixed with ones only estimated or measured under
    # another regime (T4, H200), so the one-regime-per-plan rule is exercised.
    kinds = [("A100-40", 1), ("A100-40", 2), ("V100-16", 1), ("V100-16", 4), ("T4", 1), ("H200", 2)]
    for _ in range(40):
        mbs, stages = _random_plan(rng, s, kinds, s.num_layers)
        res = s.fast.evaluate(mbs, list(stages))
        ev = Evaluated(score=0.0, mbs=mbs, stages=stages, res=res, feasible=True)
        sim = simulate(s.to_plan(ev), profiles=profiles, network=network)
        assert res.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-9)
        assert res.usd_per_iteration == pytest.approx(sim.usd_per_iteration, rel=1e-9)
        assert res.usd_per_hour == pytest.approx(sim.usd_per_hour, rel=1e-9)
        assert res.peak_memory_bytes == sim.peak_memory_bytes
        assert res.fits == sim.fits
        busy = tuple(max(r.num_microbatches * (r.fwd_s + r.bwd_s) for r in st.replicas) for st in sim.stages)
        assert res.busy_s == pytest.approx(busy, rel=1e-12)
