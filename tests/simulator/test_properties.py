"""Properties that must hold for any plan, checked with hypothesis."""

from hypothesis import given, settings
from hypothesis import strategies as st

from sailor_core.catalog.gpus import get_gpu
from sailor_core.simulator import one_f_one_b_time, simulate, stage_timing
from sailor_core.simulator.memory import stage_memory
from sailor_core.regimes import get_regime
from tests.simulator.helpers import db_of, flat_network, hand_profile, plan

DB = db_of(hand_profile("A100-40"), hand_profile("V100-16", fwd_s=(0.002, 0.003, 0.005, 0.004)))
NET = flat_network(2e9, 1e-5)
SPLITS = [[(0, 4)], [(0, 2), (2, 4)], [(0, 1), (1, 3), (3, 4)], [(0, 1), (1, 2), (2, 3), (3, 4)]]


def _balanced(split, dp, gbs, gpu="A100-40"):
    return plan([{"layers": list(s), "replicas": [{"gpu": gpu, "tp": 1, "zone": "local"}] * dp} for s in split],
                gbs=gbs)


@settings(max_examples=60, deadline=None)
@given(split=st.sampled_from(SPLITS), dp=st.integers(1, 6), gbs=st.integers(7, 64),
       stage=st.integers(0, 3), gpu=st.sampled_from(["A100-40", "V100-16"]))
def test_adding_a_replica_never_increases_compute(split, dp, gbs, stage, gpu):
    base = _balanced(split, dp, gbs, gpu)
    stage = stage % len(split)
    grown_stages = [{"layers": list(s), "replicas": [{"gpu": gpu, "tp": 1, "zone": "local"}] * (dp + (i == stage))}
                    for i, s in enumerate(split)]
    grown = plan(grown_stages, gbs=gbs)
    a = simulate(base, profiles=DB, network=NET)
    b = simulate(grown, profiles=DB, network=NET)
    assert b.breakdown["compute"] <= a.breakdown["compute"] * (1 + 1e-12)
    assert b.breakdown["compute"] + b.breakdown["bubble"] <= (a.breakdown["compute"] + a.breakdown["bubble"]) * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 63), start=st.integers(0, 3), length=st.integers(1, 4),
       regime=st.sampled_from(["torch-bf16-autocast-adamw", "megatron-fp32-adamw"]))
def test_memory_grows_with_microbatches_in_flight(k, start, length, regime):
    prof = DB.get("tiny", "A100-40", 1, 1, 64)
    end = min(4, start + length)
    r = get_regime(regime)
    less = stage_memory(prof, start, end, k, r, 10**12)
    more = stage_memory(prof, start, end, k + 1, r, 10**12)
    assert more.peak_bytes > less.peak_bytes
    assert more.state_bytes == less.state_bytes


@settings(max_examples=100, deadline=None)
@given(
    replicas=st.lists(st.lists(st.tuples(st.floats(1e-4, 1.0), st.integers(0, 40)), min_size=1, max_size=4),
                      min_size=1, max_size=5),
    links=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 40)), min_size=4, max_size=4),
)
def test_pipeline_parts_are_consistent(replicas, links):
    stages = [stage_timing([t for t, _ in reps], [n for _, n in reps]) for reps in replicas]
    link_s = [t for t, _ in links[: len(stages) - 1]]
    link_n = [n for _, n in links[: len(stages) - 1]]
    pipe = one_f_one_b_time(stages, link_s, link_n)
    assert pipe.compute_s >= 0 and pipe.bubble_s >= 0 and pipe.p2p_s >= 0
    # never faster than any stage's own work, nor than one micro-batch's round trip
    assert pipe.total_s >= max(s.busy_s for s in stages) - 1e-9
    assert pipe.total_s >= sum(s.step_s for s in stages) + sum(link_s) - 1e-9
    # slower links never make the iteration faster
    if link_s:
        slower = one_f_one_b_time(stages, [t * 1.5 + 0.01 for t in link_s], link_n)
        assert slower.total_s >= pipe.total_s - 1e-9


GPUS = ["A100-40", "V100-16", "H100-80", "H200", "GH-96", "RTX-3090", "T4", "L4", "A10G"]
ZONES = ["us-central1-a", "us-central1-b", "us-west1-b", "us-east-1a", "us-east-1b", "eu-west-1a"]


@st.composite
def real_plans(draw):
    num_stages = draw(st.integers(1, 4))
    cuts = sorted(draw(st.sets(st.integers(1, 25), min_size=num_stages - 1, max_size=num_stages - 1)))
    bounds = [0, *cuts, 26]
    stages = []
    for a, b in zip(bounds, bounds[1:]):
        reps = []
        for _ in range(draw(st.integers(1, 4))):
            gpu = draw(st.sampled_from(GPUS))
            tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t in get_gpu(gpu).gpus_per_node]))
            reps.append({"gpu": gpu, "tp": tp, "zone": draw(st.sampled_from(ZONES))})
        stages.append({"layers": [a, b], "replicas": reps})
    mbs = draw(st.sampled_from([1, 2, 4]))
    return plan(stages, model="opt-350m", mbs=mbs, gbs=mbs * draw(st.integers(4, 64)))


@settings(max_examples=20, deadline=None)
@given(p=real_plans())
def test_any_valid_plan_simulates_consistently_with_the_shipped_data(p):
    from sailor_core.network import default_network
    from sailor_core.profiles import default_profile_db

    r = simulate(p, profiles=default_profile_db(), network=default_network())
    assert r.iteration_time_s > 0
    assert abs(sum(r.breakdown.values()) - r.iteration_time_s) <= 1e-9 * r.iteration_time_s
    assert all(v >= 0 for v in r.breakdown.values())
    assert r.usd_per_iteration >= r.gpu_usd_per_iteration > 0 and r.egress_usd_per_iteration >= 0
    assert r.fits == all(rep.memory.peak_bytes <= rep.memory.capacity_bytes
                         for s in r.stages for rep in s.replicas)
    assert (r.why_not is None) == r.fits
    assert r.peak_memory_bytes == max(rep.memory.peak_bytes for s in r.stages for rep in s.replicas)
