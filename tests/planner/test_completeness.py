"""The search is complete where it says so: on small scenarios whose best plan needs an odd
data-parallel degree, fewer replicas than the pools hold, or an uneven layer split, it finds the
optimum of an exhaustive enumeration over *every* DP degree the pools allow (not only the
degrees the search itself covers), and says which degrees its proof covers.  Where the optimum
needs a stage mixing GPU types, the search finds the optimum of an exhaustive enumeration of
every mixed plan (pools of at most ``MAX_MIXED_GPUS`` GPUs: ``planner/mixed_space.py``), and
says what its proof covers, beyond those pools too."""

import pytest

from sailor_core.errors import InfeasibleError
from sailor_core.planner import make_request, plan_job
from sailor_core.planner.exhaustive import enumerate_best, enumerate_mixed_best
from sailor_core.planner.mixed_space import MAX_MIXED_GPUS, STAGE_SPACES
from sailor_core.planner.search.shapes import DP_SPACES, dp_degrees

A, V = "A100-40", "V100-16"
ZA, ZB, ZC = "us-central1-a", "us-central1-b", "us-central1-c"

SCENARIOS = {
    # 315 micro-batches over at most 7 replicas: every one busy, 45 each
    "odd DP in one zone": ("odd", dict(model="small", availability={(A, ZA): 7}, global_batch_size=315)),
    # 11 GPUs over three zones, one ring across all of them
    "odd DP over three zones": ("odd", dict(model="small", availability={(A, ZA): 4, (A, ZB): 4, (A, ZC): 3},
                                    global_batch_size=330)),
    # a model so small that its gradient ring costs more than extra replicas save
    "fewer replicas than the pools hold": ("fewer", dict(model="small", availability={(A, ZA): 5, (A, ZB): 5, (A, ZC): 3},
                                               global_batch_size=24)),
    # 7 replicas at 45 micro-batches are cheaper per iteration than 8 at 40 (the floor admits both)
    "odd DP under a floor, cost objective": ("odd", dict(model="small", availability={(A, ZA): 8}, global_batch_size=315,
                                                 objective="cost", min_throughput_samples_per_s=900.0)),
    # the faster GPU's stage takes more layers
    "uneven split over two GPU types": ("uneven", dict(model="opt-350m", availability={(A, ZA): 2, (V, ZA): 2},
                                            global_batch_size=16, micro_batch_sizes=(1, 2))),
}


# Scenarios whose optimum is a stage of several GPU types (``enumerate_mixed_best``) and beats
# every plan whose stages hold one GPU type: one A100 and two V100s as one stage of DP 3, the A100
# first so that it takes the extra micro-batch of 16; the same over two zones (the ring crosses
# them); an A100 first with three L4s; and a floor that only a mixed stage meets.
L4 = "L4"
MIXED = {
    "a mixed stage (A100 + 2 V100)": dict(model="small", availability={(A, ZA): 1, (V, ZA): 2},
                                          global_batch_size=1024),
    "a mixed stage over two zones (A100 + 2 V100)": dict(model="small", availability={(A, ZA): 1, (V, ZB): 2},
                                                         global_batch_size=1024),
    "a mixed stage (A100 + 3 L4)": dict(model="small", availability={(A, ZA): 1, (L4, ZA): 3},
                                        global_batch_size=1024),
    "a floor only a mixed stage meets, cost objective (A100 + 3 V100)": dict(
        model="small", availability={(A, ZA): 1, (V, ZA): 3}, global_batch_size=1024, objective="cost",
        min_throughput_samples_per_s=5000.0),
}


def _dp_of(ev) -> list[int]:
    return [sum(n for _, _, n in s.groups) for s in ev.stages]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_search_finds_the_optimum_over_every_dp_degree(name, profiles, network):
    need, kw = SCENARIOS[name]
    req = make_request(mixed_stages=False, max_stages=2, **kw)
    exact = enumerate_best(req, profiles=profiles, network=network, every_degree=True)
    ours = plan_job(req, profiles=profiles, network=network)
    # the scenario's optimum needs what its name says
    dp = _dp_of(exact.best)
    layers = [s.layer_end - s.layer_start for s in exact.best.stages]
    needs = {"odd": any(d % 2 for d in dp), "fewer": sum(dp) < sum(req.availability.values()),
             "uneven": len(set(layers)) > 1}
    assert needs[need], (dp, layers)
    assert ours.best.usd_per_iteration == pytest.approx(exact.best.res.usd_per_iteration, rel=1e-9)
    assert ours.best.throughput_samples_per_s == pytest.approx(exact.best.res.throughput_samples_per_s, rel=1e-9)
    assert ours.exhausted and ours.searched_dp_degrees in DP_SPACES.values()


def test_efficient_degrees_are_the_fewest_replicas_per_busiest_count():
    for num_mb in (1, 7, 24, 256, 315, 1024):
        for d_max in (1, 5, 37, 64, 300):
            got = dp_degrees("efficient", d_max, num_mb, [d_max])
            for d in range(1, d_max + 1):
                busiest = -(-num_mb // d)
                fewest = min(e for e in range(1, d + 1) if -(-num_mb // e) == busiest)
                assert fewest in got  # every busiest-replica count reachable is searched, at its fewest GPUs
            assert all(-(-num_mb // (d - 1)) != -(-num_mb // d) for d in got if d > 1)


def test_zone_degrees_hold_the_most_each_number_of_zones_can():
    # 256 micro-batches; zones of 20, 20, 20, 16 replicas; 2 stages of 38 at most
    got = dp_degrees("zones", 38, 256, [20, 20, 20, 16])
    assert 37 in got  # Sailor's geo row 1 degree: 38 replicas' busiest (7) at 37
    assert 20 in got and 16 in got  # one zone; the largest dividing the micro-batches


def test_placements_list_a_ring_s_zones_in_ring_order():
    from sailor_core.planner.placement import place_pipelines, place_stages
    from sailor_core.zones import ring_order_key

    pools = {"us-central1-b": 2, "europe-west4-a": 2, "us-east-1a": 2, "us-central1-a": 2, "asia-east1-a": 2}
    for placed in (place_stages(pools, 1, 9, 1), place_pipelines(pools, 1, 9, 1)):
        zones = [z for z, _ in placed[0]]
        assert zones == sorted(zones, key=ring_order_key) and len(zones) == 5
        # each cloud, then each continent, contiguous: a ring crosses clouds twice, continents 2 + 2
        clouds = [ring_order_key(z)[0] for z in zones]
        assert sum(1 for x, y in zip(clouds, clouds[1:] + clouds[:1]) if x != y) == 2


def _gpus_per_stage(ev) -> list[set[str]]:
    return [{g[0].gpu for g in s.groups} for s in ev.stages]


@pytest.mark.parametrize("name", sorted(MIXED))
def test_the_search_finds_the_mixed_optimum(name, profiles, network):
    req = make_request(max_stages=2, **MIXED[name])
    mixed = enumerate_mixed_best(req, profiles=profiles, network=network)
    one_type = enumerate_best(req, profiles=profiles, network=network, every_degree=True)
    # the scenario's optimum needs a stage of several GPU types
    assert any(len(gpus) > 1 for gpus in _gpus_per_stage(mixed.best))
    assert one_type.best is None or mixed.best.score < one_type.best.score
    ours = plan_job(req, profiles=profiles, network=network)
    _assert_same_figures(ours, mixed.best)
    assert ours.exhausted and ours.searched_stages == STAGE_SPACES["mixed"]
    assert ours.searched_dp_degrees == DP_SPACES["every"]
    # the answer's mixed stage is named, as within the proof
    plan_mixes = [len({r.gpu for r in st.replicas}) > 1 for st in ours.best.plan.stages]
    assert any(plan_mixes)
    for i, mixes in enumerate(plan_mixes):
        assert (f"stage {i} (" in ours.explanation) == mixes
    assert "within the proof" in ours.explanation and "may exist" not in ours.explanation
    # without mixed stages, the answer is the one-type optimum (or none) and says no stage mixes
    plain_req = make_request(max_stages=2, mixed_stages=False, **MIXED[name])
    if one_type.best is None:
        with pytest.raises(InfeasibleError):
            plan_job(plain_req, profiles=profiles, network=network)
        return
    plain = plan_job(plain_req, profiles=profiles, network=network)
    _assert_same_figures(plain, one_type.best)
    assert plain.exhausted and plain.searched_stages == STAGE_SPACES["one-type"] and "stage 0 (" not in plain.explanation


def _assert_same_figures(ours, ev) -> None:
    assert ours.best.usd_per_iteration == pytest.approx(ev.res.usd_per_iteration, rel=1e-9)
    assert ours.best.throughput_samples_per_s == pytest.approx(ev.res.throughput_samples_per_s, rel=1e-9)


@pytest.mark.parametrize("name", sorted(n for n, (_, kw) in SCENARIOS.items()
                                        if sum(kw["availability"].values()) <= MAX_MIXED_GPUS))
def test_on_small_pools_the_proof_covers_every_mixed_plan(name, profiles, network):
    # the one-type scenarios with mixed stages allowed: the optimum over every mixed plan
    req = make_request(max_stages=2, **SCENARIOS[name][1])
    mixed = enumerate_mixed_best(req, profiles=profiles, network=network)
    ours = plan_job(req, profiles=profiles, network=network)
    _assert_same_figures(ours, mixed.best)
    assert ours.exhausted and ours.searched_stages == STAGE_SPACES["mixed"]


def test_beyond_small_pools_the_answer_says_mixed_stages_are_unproven(profiles, network):
    _, kw = SCENARIOS["odd DP over three zones"]
    assert sum(kw["availability"].values()) > MAX_MIXED_GPUS
    ours = plan_job(make_request(max_stages=2, **kw), profiles=profiles, network=network)
    assert ours.searched_stages == STAGE_SPACES["leftover"] and "does not cover" in ours.searched_stages
    assert ours.searched_dp_degrees in DP_SPACES.values()


def test_the_mixed_yardstick_holds_the_one_type_space(profiles, network):
    # every plan the one-type enumeration scores is one of the mixed enumeration's (TP and zones
    # alike), so its optimum is never below the one-type optimum, on the one-type scenarios too
    for name in ("uneven split over two GPU types", "odd DP in one zone"):
        req = make_request(mixed_stages=False, max_stages=2, **SCENARIOS[name][1])
        mixed = enumerate_mixed_best(req, profiles=profiles, network=network)
        one_type = enumerate_best(req, profiles=profiles, network=network, every_degree=True)
        assert mixed.best.res.throughput_samples_per_s >= one_type.best.res.throughput_samples_per_s * (1 - 1e-12)
