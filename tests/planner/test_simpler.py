"""Uneven splits only where they truly win: a plan within the simulator's tolerance of the best
gives way to a simpler one (even split, fewer zones, less egress), and the answer says so."""

from sailor_core.planner import make_request, plan_job
from sailor_core.planner import simpler
from sailor_core.planner.baseline import equal_split
from sailor_core.source_data import SAILOR_CONFIGS_DIR
from sailor_core.traces import load_gpu_trace


def _geo_row(row: int):
    trace = load_gpu_trace(SAILOR_CONFIGS_DIR / "gpu_trace_multizone.csv")
    avail = {k: n for k, n in trace.row(row).items() if n}
    return make_request(model="opt-350m", availability=avail, global_batch_size=1024, spot=False, top_n=1)


def _sizes(plan):
    return [s.num_layers for s in plan.stages]


def test_an_uneven_split_that_wins_by_less_than_the_tolerance_gives_way(profiles, network, monkeypatch):
    req = _geo_row(2)
    chosen = plan_job(req, profiles=profiles, network=network)
    monkeypatch.setattr(simpler, "SIMPLER_WITHIN", 0.0)
    strict = plan_job(req, profiles=profiles, network=network)
    L = chosen.best.plan.stages[-1].layer_end
    # without the tolerance the best plan splits unevenly; with it, an even split within 2 %
    assert _sizes(strict.best.plan) != [b - a for a, b in zip([0, *equal_split(L, len(strict.best.plan.stages))],
                                                              equal_split(L, len(strict.best.plan.stages)))]
    assert [s.layer_end for s in chosen.best.plan.stages] == equal_split(L, len(chosen.best.plan.stages))
    assert strict.best.throughput_samples_per_s > chosen.best.throughput_samples_per_s
    assert chosen.best.throughput_samples_per_s >= (1 - 0.02) * strict.best.throughput_samples_per_s
    assert "even layer split" in chosen.explanation and "2%" in chosen.explanation
    assert strict.explanation == ""


def test_a_clear_win_keeps_its_uneven_split(profiles, network):
    # A100s and V100s: the faster GPUs' stages take more layers, by far more than 2 %.
    req = make_request(model="opt-350m", availability={("A100-40", "us-central1-a"): 8,
                                                       ("V100-16", "us-central1-a"): 16}, global_batch_size=256)
    result = plan_job(req, profiles=profiles, network=network)
    assert len(set(_sizes(result.best.plan))) > 1 and result.explanation == ""
