"""Planner behaviour on small cases: known optimum, limits respected, infeasibility explained."""

import sys
import subprocess

import pytest

from sailor_core.errors import InfeasibleError
from sailor_core.planner import make_request, plan_job
from sailor_core.planner.exhaustive import enumerate_best
from sailor_core.planner.simpler import SIMPLER_WITHIN
from sailor_core.simulator import simulate

A, V = "A100-40", "V100-16"
ZA, ZB = "us-central1-a", "us-central1-b"


def _small(**kw):
    base = dict(model="small", availability={(A, ZA): 4, (V, ZB): 4}, global_batch_size=64,
                max_stages=4, micro_batch_sizes=(1, 2, 4), mixed_stages=False)
    base.update(kw)
    return make_request(**base)


def test_single_gpu_optimum_is_the_best_micro_batch(profiles, network):
    # One GPU: the space is just the micro-batch size; the optimum is known by brute force.
    req = make_request(model="small", availability={(A, ZA): 1}, global_batch_size=64)
    result = plan_job(req, profiles=profiles, network=network)
    plan = result.best.plan
    assert plan.num_gpus == 1 and plan.pp_degree == 1
    best = max(
        simulate(plan.__class__(model="small", global_batch_size=64, micro_batch_size=b, stages=plan.stages),
                 profiles=profiles, network=network).throughput_samples_per_s
        for b in (1, 2, 4, 8, 16, 32, 64)
    )
    assert result.best.throughput_samples_per_s == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("objective", ["throughput", "cost"])
def test_matches_exhaustive_enumeration(objective, profiles, network):
    req = _small(objective=objective)
    exact = enumerate_best(req, profiles=profiles, network=network)
    got = plan_job(req, profiles=profiles, network=network).best
    assert exact.num_plans > 1000
    if objective == "throughput":
        assert got.throughput_samples_per_s >= 0.99 * exact.best.res.throughput_samples_per_s
    else:
        assert got.usd_per_iteration <= 1.01 * exact.best.res.usd_per_iteration


def test_returned_plans_round_trip_through_simulate(profiles, network):
    result = plan_job(_small(top_n=4), profiles=profiles, network=network)
    assert 1 <= len(result.candidates) <= 4
    thr = [c.throughput_samples_per_s for c in result.candidates]
    if result.explanation.startswith("preferred the simpler plan"):
        # a simpler plan within the simulator's tolerance goes first; the rest keep their order
        assert thr[0] >= (1 - SIMPLER_WITHIN) * max(thr)
        thr = thr[1:]
    assert thr == sorted(thr, reverse=True)
    for cand in result.candidates:
        sim = simulate(cand.plan, profiles=profiles, network=network)
        assert sim.fits
        assert sim.throughput_samples_per_s == pytest.approx(cand.throughput_samples_per_s, rel=1e-12)
        assert sim.usd_per_iteration == pytest.approx(cand.usd_per_iteration, rel=1e-12)
        used = cand.plan.gpus_by_type_zone()
        assert all(n <= {(A, ZA): 4, (V, ZB): 4}[k] for k, n in used.items())
    assert result.num_disagreements == 0


def test_deterministic(profiles, network):
    a = plan_job(_small(), profiles=profiles, network=network)
    b = plan_job(_small(), profiles=profiles, network=network)
    assert [c.plan for c in a.candidates] == [c.plan for c in b.candidates]


def test_uneven_split_on_heterogeneous_gpus(profiles, network):
    # opt-350m over A100s and V100s: the best plan gives the faster GPUs' stages more layers.
    req = make_request(model="opt-350m", availability={(A, ZA): 8, (V, ZA): 16}, global_batch_size=256)
    best = plan_job(req, profiles=profiles, network=network).best.plan
    assert {r.gpu for s in best.stages for r in s.replicas} == {A, V}
    sizes = {s.num_layers for s in best.stages}
    assert len(sizes) > 1


def test_cost_cap_respected_by_every_plan(profiles, network):
    free = plan_job(_small(top_n=5), profiles=profiles, network=network)
    cap = 0.8 * free.best.usd_per_iteration
    hour_cap = 0.6 * free.best.sim.usd_per_hour
    capped = plan_job(_small(top_n=5, max_usd_per_iteration=cap, max_usd_per_hour=hour_cap),
                      profiles=profiles, network=network)
    for cand in capped.candidates:
        assert cand.usd_per_iteration <= cap
        assert cand.sim.usd_per_hour <= hour_cap


def test_throughput_floor_respected_by_every_plan(profiles, network):
    fastest = plan_job(_small(), profiles=profiles, network=network).best.throughput_samples_per_s
    floor = 0.7 * fastest
    result = plan_job(_small(objective="cost", min_throughput_samples_per_s=floor, top_n=5),
                      profiles=profiles, network=network)
    usd = [c.usd_per_iteration for c in result.candidates]
    assert usd == sorted(usd)
    for cand in result.candidates:
        assert cand.throughput_samples_per_s >= floor


def test_floor_above_best_says_what_is_achievable(profiles, network):
    # the best found, not the simpler plan a faster one may have given way to
    fastest = max(c.throughput_samples_per_s for c in plan_job(_small(), profiles=profiles, network=network).candidates)
    with pytest.raises(InfeasibleError, match="above the best achievable") as exc:
        plan_job(_small(objective="cost", min_throughput_samples_per_s=3 * fastest),
                 profiles=profiles, network=network)
    # The message names the best achievable figure (to 4 significant digits).
    assert f"{fastest:.4g}"[:3] in str(exc.value)


def test_cap_below_cheapest_says_what_the_cheapest_costs(profiles, network):
    cheapest = plan_job(_small(objective="cost"), profiles=profiles, network=network).best.usd_per_iteration
    with pytest.raises(InfeasibleError, match="below the cheapest plan") as exc:
        plan_job(_small(max_usd_per_iteration=cheapest / 10), profiles=profiles, network=network)
    assert f"{cheapest:.4g}"[:3] in str(exc.value)


def test_nothing_fits_in_memory_is_explained(profiles, network):
    req = make_request(model="opt-30b", availability={("T4", ZA): 2}, global_batch_size=8)
    with pytest.raises(InfeasibleError, match="fits in GPU memory"):
        plan_job(req, profiles=profiles, network=network)


def test_planner_imports_no_torch_or_prefect():
    code = (
        "import sys; import sailor_core.planner, flows.cli.plan; "
        "from sailor_core.planner import api, search, fastsim, exhaustive; "
        "bad = [m for m in ('torch', 'prefect', 'boto3') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_floor_above_the_best_found_says_found_where_no_proof_was_completed(profiles, network):
    # "achievable" is the claim of the search for the fastest plan, made without the floor; one
    # stopped by its budget found a plan, which the message says it is (a cap's "cheapest plan"
    # reads the same way: explain._cap_reasons)
    limits = {"objective": "cost", "min_throughput_samples_per_s": 1e9}
    with pytest.raises(InfeasibleError, match="above the best achievable"):
        plan_job(_small(**limits), profiles=profiles, network=network)
    with pytest.raises(InfeasibleError, match="above the best found") as exc:
        plan_job(_small(max_evaluations=2, patience=1, **limits), profiles=profiles, network=network)
    assert "the search stopped before proving it the best" in str(exc.value)


def test_a_cap_below_the_cheapest_found_says_found_where_no_proof_was_completed(profiles, network):
    # the cap's twin of the floor test above: "the cheapest plan" is the claim of an exhausted
    # search for the cheapest plan, made without the cap; a budgeted one names what it found
    req = dict(model="opt-1.3b", availability={(A, ZA): 64, (V, ZB): 64, (A, ZB): 16},
               global_batch_size=64, max_usd_per_iteration=1e-6)
    with pytest.raises(InfeasibleError, match="below the cheapest plan, which costs") as proven:
        plan_job(make_request(**req), profiles=profiles, network=network)
    with pytest.raises(InfeasibleError, match="below the cheapest plan found") as found:
        plan_job(make_request(max_evaluations=5, patience=1, **req), profiles=profiles, network=network)
    assert "the search stopped before proving it the cheapest" in str(found.value)
    assert "stopped" not in str(proven.value)


def test_a_search_out_of_budget_names_only_the_limits_the_request_sets(profiles, network):
    # a cap alone once read "no plan meeting the caps and the floor together"
    req = make_request(model="opt-350m", availability={(A, ZA): 32}, global_batch_size=64,
                       max_usd_per_iteration=1e-12, max_evaluations=1, patience=1)
    with pytest.raises(InfeasibleError, match="no plan meeting the cost cap within its budget") as exc:
        plan_job(req, profiles=profiles, network=network)
    assert "floor" not in str(exc.value)
