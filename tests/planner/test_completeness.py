"""The search is complete where it says so: on small scenarios whose best plan needs an odd
data-parallel degree, fewer replicas than the pools hold, or an uneven layer split, it finds the
optimum of an exhaustive enumeration over *every* DP degree the pools allow (not only the
degrees the search itself covers), and says which degrees its proof covers."""

import pytest

from sailor_core.planner import make_request, plan_job
from sailor_core.planner.exhaustive import enumerate_best
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
