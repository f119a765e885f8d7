"""The embedding group's sum of a tied matrix belongs to the framework (issue 35, kind 1): Sailor's
engine and Megatron sum it between the first and the last stage; under DeepSpeed's pipeline
engine Sailor's models declare no ``TiedLayerSpec`` (OPT's and Llama's heads are LayerSpecs
with a matrix of their own, GPT-Neo's pipeline has none), so nothing is summed there and each
stage's DP ring carries what the stage holds.  ``simulate`` and the planner's fast path read
the same rule (``compose.ties_embedding_across_stages``), and so does memory: no tied copy on a
DeepSpeed last stage, which holds what its profile's head counts (GPT-Neo's pipe: no head)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sailor_core.network.model import default_network
from sailor_core.plan.types import plan_from_dict
from sailor_core.planner import make_request
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.profiles import default_profile_db
from sailor_core.regimes import get_regime
from sailor_core.simulator import compose, memory, simulate
from sailor_core.simulator import stage as st
from sailor_core.simulator.tables import layer_table
from tests.simulator.helpers import db_of, flat_network, hand_profile, plan

DEEPSPEED = "megatron-fp32-adamw"
ENGINE = "torch-bf16-autocast-adamw"
MATRIX = 512 * 64  # tiny's vocabulary x hidden: the tied matrix


def test_only_deepspeed_has_no_embedding_group():
    assert not compose.ties_embedding_across_stages(DEEPSPEED)
    assert compose.ties_embedding_across_stages(ENGINE)
    assert compose.ties_embedding_across_stages("torch-fp32-adamw")


def _two_stages(regime: str, dp: int):
    prof = replace(hand_profile("A100-40"), regime=regime)
    reps = [{"gpu": "A100-40", "tp": 1, "zone": "local"}] * dp
    p = plan([{"layers": [0, 2], "replicas": reps}, {"layers": [2, 4], "replicas": reps}], gbs=4 * dp)
    return prof, simulate(p, profiles=db_of(prof), network=flat_network(1e9))


def test_deepspeed_sums_no_tied_matrix_between_stages():
    # one replica per stage: the only sync after the pipeline is the embedding group's, a ring of
    # two over tiny's 512 x 64 fp32 matrix (2 x 1 step of half of it at 1 GB/s) under the engine
    _, engine = _two_stages(ENGINE, 1)
    _, deepspeed = _two_stages(DEEPSPEED, 1)
    assert engine.breakdown["dp_sync"] == pytest.approx(MATRIX * 4 / 1e9)
    assert deepspeed.breakdown["dp_sync"] == 0.0


def test_deepspeed_stages_sync_their_whole_weights_over_their_replicas():
    # hand profile: 1000 params in layer 0, 2000 in each block, 1000 in the head (which leaves the
    # tied matrix out).  Under the engine the last stage holds a copy, and the rings leave the
    # matrix to the embedding group: stage 0 syncs its block, stage 1 its block and head.  Under
    # DeepSpeed nothing is tied across stages: the last stage holds what its head counts (no
    # copy) and the first stage's ring carries layer 0 as well.
    for regime, first, last, tied in ((ENGINE, 2000, 3000, MATRIX), (DEEPSPEED, 3000, 3000, 0)):
        prof = replace(hand_profile("A100-40"), regime=regime)
        r = get_regime(regime)
        assert st.dp_sync_bytes(prof, 0, 2, r) == first * r.grad_bytes_per_param
        assert st.dp_sync_bytes(prof, 2, 4, r) == last * r.grad_bytes_per_param
        assert st.tied_sync_bytes(prof, r) == tied * r.grad_bytes_per_param
    # with two replicas per stage both of DeepSpeed's rings carry 3000 parameters, and neither
    # stage adds an embedding group's sum
    _, deepspeed = _two_stages(DEEPSPEED, 2)
    assert deepspeed.stages[1].dp_sync_s == pytest.approx(deepspeed.stages[0].dp_sync_s)
    assert deepspeed.stages[0].dp_sync_s > 0


def _gpt_neo_plan(num_stages: int) -> dict:
    cuts = [round(i * 34 / num_stages) for i in range(num_stages + 1)]
    return {"model": "gpt-neo-2.7b", "global_batch_size": 32, "micro_batch_size": 1,
            "stages": [{"layers": [cuts[i], cuts[i + 1]],
                        "replicas": [{"gpu": "GH-96", "tp": 4, "zone": "us-central1-a"}]}
                       for i in range(num_stages)]}


@pytest.mark.parametrize("num_stages", [2, 4])
def test_sailor_gpt_neo_pipeline_has_no_embedding_sum(num_stages, monkeypatch):
    # Sailor's GPT-Neo profile (DeepSpeed's regime) has no head; one replica per stage: no sync at all
    p = plan_from_dict(_gpt_neo_plan(num_stages))
    deepspeed = simulate(p)
    assert deepspeed.breakdown["dp_sync"] == 0.0
    monkeypatch.setattr(memory, "ties_embedding_across_stages", lambda regime_name: True)
    assert simulate(p).breakdown["dp_sync"] > 0.0  # what the rule took out


def test_fast_path_agrees_without_the_embedding_group():
    profiles, network = default_profile_db(), default_network()
    req = make_request(model="gpt-neo-2.7b", availability={("A100-40", "us-central1-a"): 8}, global_batch_size=64)
    s = Searcher(req, profiles=profiles, network=network)
    kind = s.kinds.get("A100-40", 1, 1)
    assert kind.profile.regime == DEEPSPEED
    stages = [FastStage(0, 17, ((kind, "us-central1-a", 2),)), FastStage(17, s.num_layers, ((kind, "us-west1-b", 2),))]
    res = s.fast.evaluate(1, stages)
    sim = simulate(s.to_plan(Evaluated(score=0.0, mbs=1, stages=tuple(stages), res=res, feasible=True)),
                   profiles=profiles, network=network)
    assert res.iteration_time_s == pytest.approx(sim.iteration_time_s, rel=1e-9)
    assert res.usd_per_iteration == pytest.approx(sim.usd_per_iteration, rel=1e-9)


def test_sailor_gpt_neo_last_stage_holds_what_its_headless_profile_counts(monkeypatch):
    # Sailor's GPTNeoModelPipe ends with a LayerNorm: its last stage holds no copy of the
    # embedding, and its loss reads the norm's hidden-wide output, not vocabulary logits
    prof = default_profile_db().get("gpt-neo-2.7b", "GH-96", 4, 1)
    regime = get_regime(prof.regime)
    assert prof.regime == DEEPSPEED and memory.headless(prof)
    last = len(prof.layers)
    mem = memory.stage_memory(prof, 17, last, 1, regime, 1 << 40)
    assert mem.num_params == prof.params(17, last)
    assert memory.profile_head_logits(prof) == 2048 * 2560
    # the one predicate, flipped: the framework would tie a copy and its loss read vocabulary logits
    monkeypatch.setattr(memory, "ties_embedding_across_stages", lambda regime_name: True)
    tied = memory.stage_memory(prof, 17, last, 1, regime, 1 << 40)
    assert tied.num_params - mem.num_params == -(-50257 // 4) * 2560
    assert memory.profile_head_logits(prof) == 2048 * -(-50257 // 4)


def test_an_estimated_head_under_deepspeed_counts_its_own_matrix():
    # Sailor's OPT and Llama pipes give the head a matrix of its own (no TiedLayerSpec): an
    # estimated head counts it under DeepSpeed's regime, reads the same bytes and does the same
    # work as the tied head under the engine's (so only parameters move, not time)
    from sailor_core.catalog.layers import layer_shapes

    for model in ("opt-1.3b", "llama-3.2-1b"):
        deepspeed = layer_shapes(model, tp_degree=4, regime=DEEPSPEED)[-1]
        engine = layer_shapes(model, tp_degree=4, regime="torch-fp32-adamw")[-1]
        spec_rows = -(-{"opt-1.3b": 50272, "llama-3.2-1b": 128256}[model] // 4)
        assert deepspeed.params - engine.params == spec_rows * 2048
        assert deepspeed.params_read == engine.params_read
        assert deepspeed.fwd_flops_per_token == engine.fwd_flops_per_token
    # its last stage holds that matrix once (no copy), a whole-model stage two vocabulary matrices
    prof = default_profile_db().get("opt-1.3b", "GH-96", 4, 1)
    assert prof.regime == DEEPSPEED and not memory.headless(prof)
    assert memory.tied_copy_params(prof) == 0
    last = len(prof.layers)
    assert memory.stage_params_held(layer_table(prof), 12, last) == prof.params(12, last)
    assert prof.layers[-1].params >= -(-50272 // 4) * 2048
