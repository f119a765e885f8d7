"""The memory levers in the simulator (issue 34): what recomputation and ZeRO save and cost, from
the layer shapes, and a plan's levers read by ``simulate`` and written by the plan file."""

import dataclasses

import pytest

from sailor_core.catalog.layers import attention_core
from sailor_core.catalog.models import get_model
from sailor_core.plan.types import Plan, Replica, Stage, plan_from_dict
from sailor_core.profiles import default_profile_db
from sailor_core.regimes import get_regime
from sailor_core.simulator import simulate
from sailor_core.simulator.levers import recompute_working_bytes, recomputed_profile, zero_sync_factor
from sailor_core.simulator.memory import stage_memory
from sailor_core.simulator.simulate import stage_memory_for, stage_memory_under
from sailor_core.simulator.tables import layer_table

MODEL, GPU = "opt-2.7b", "V100-16"


def _profile(model=MODEL, gpu=GPU, tp=1, mbs=1):
    spec = get_model(model)
    return default_profile_db().get(model, gpu, tp, mbs, spec.seq_len)


def test_selective_drops_the_attention_core_and_reruns_its_share():
    base = _profile()
    sel = recomputed_profile(base, "selective")
    assert recomputed_profile(base, "selective") is sel and recomputed_profile(base, "none") is base
    spec = get_model(MODEL)
    saved, flops = attention_core(MODEL, tp_degree=1, seq_len=spec.seq_len, regime=base.regime, index=1)
    # eager attention (Sailor's Megatron profiles): the probabilities, heads x s x s per sequence
    assert saved == spec.num_heads * spec.seq_len * spec.seq_len * get_regime(base.regime).activation_bytes_per_element
    for i in (0, spec.num_layers + 1):  # the embedding and the head are not recomputed
        assert sel.layers[i] == base.layers[i]
    block, old = sel.layers[1], base.layers[1]
    assert block.activation_bytes == old.activation_bytes - saved
    assert old.bwd_s < block.bwd_s < old.bwd_s + old.fwd_s and block.fwd_s == old.fwd_s
    assert flops > 0


def test_full_keeps_each_blocks_input_and_reruns_its_forward():
    base = _profile()
    full = recomputed_profile(base, "full")
    spec = get_model(MODEL)
    for i in range(1, spec.num_layers + 1):
        assert full.layers[i].activation_bytes == base.layers[i - 1].output_bytes
        assert full.layers[i].bwd_s == base.layers[i].bwd_s + base.layers[i].fwd_s
    assert recompute_working_bytes(full) == base.layers[1].activation_bytes - full.layers[1].activation_bytes
    assert recompute_working_bytes(base) == 0
    # K micro-batches in flight keep only inputs: memory falls by about K x the blocks' activations
    start, end, k = 0, 17, 4
    plain = stage_memory(base, start, end, k, get_regime(base.regime), 1 << 40)
    ckpt = stage_memory(full, start, end, k, get_regime(base.regime), 1 << 40)
    assert ckpt.activation_bytes < plain.activation_bytes / 10
    assert ckpt.backward_working_bytes == plain.backward_working_bytes + recompute_working_bytes(full)


def test_zero_shards_optimizer_states_and_the_gradient_buckets_as_the_engine():
    # runtime/zero.py: ZeRO-1 and -2 keep 1/D of AdamW's states; ZeRO-2 keeps 1/D of the DP
    # buckets instead of a flat copy of the gradients, which it holds in full through the
    # backwards (micro-batches accumulate into them) and drops at the optimizer step.
    prof = _profile("opt-350m", "A100-40")
    regime = get_regime("torch-bf16-autocast-adamw")  # the engine's, with its DP buckets
    n = layer_table(prof).params(0, 10)
    for dp in (2, 3, 4):
        plain = stage_memory(prof, 0, 10, 2, regime, 1 << 40, dp)
        one = stage_memory(prof, 0, 10, 2, regime, 1 << 40, dp, zero_stage=1)
        two = stage_memory(prof, 0, 10, 2, regime, 1 << 40, dp, zero_stage=2)
        shard = -(-n // dp)
        assert plain.state_bytes - one.state_bytes == (n - shard) * regime.optimizer_bytes_per_param
        assert two.state_bytes == one.state_bytes and one.activation_bytes == plain.activation_bytes
        assert one.comm_bytes - two.comm_bytes == (n - shard) * regime.grad_bytes_per_param
    # one replica: nothing to shard over
    assert (stage_memory(prof, 0, 10, 2, regime, 1 << 40, 1, zero_stage=2).peak_bytes
            == stage_memory(prof, 0, 10, 2, regime, 1 << 40, 1).peak_bytes)
    # sync: ZeRO-1 all-reduces and all-gathers the parameters, ZeRO-2 reduce-scatters instead
    assert zero_sync_factor(0, regime) == 1.0 and zero_sync_factor(1, regime) == 1.5
    assert zero_sync_factor(2, regime) == 1.0


def test_stage_memory_for_with_no_levers_is_as_before():
    a = stage_memory_for(MODEL, GPU, 1, 1, 3, (0, 10))
    b = stage_memory_under(("none", 1, 1), MODEL, GPU, 1, 1, 3, (0, 10))
    assert a == b


def _plan(recompute="none", zero=0, dp=4):
    spec = get_model(MODEL)
    last = spec.num_layer_indices
    reps = tuple(Replica(gpu="A100-40", tp_degree=1, zone="us-central1-a") for _ in range(dp))
    return Plan(model=MODEL, global_batch_size=64, micro_batch_size=1, stages=(
        Stage(layer_start=0, layer_end=last // 2, replicas=reps, recompute=recompute, zero_stage=zero),
        Stage(layer_start=last // 2, layer_end=last, replicas=reps)))


def test_simulate_reads_the_levers():
    plain = simulate(_plan())
    full = simulate(_plan("full"))
    s0, f0 = plain.stages[0], full.stages[0]
    rep, frep = s0.replicas[0], f0.replicas[0]
    assert frep.bwd_s > rep.bwd_s and frep.fwd_s == rep.fwd_s
    assert f0.peak_memory_bytes < s0.peak_memory_bytes
    assert full.iteration_time_s > plain.iteration_time_s
    one = simulate(_plan(zero=1))
    assert one.stages[0].update_s < s0.update_s  # the step runs on a quarter of the parameters
    # all-reduce + all-gather: half an all-reduce more (the embedding group's sum, also in dp_sync_s,
    # stays; none under this plan's DeepSpeed regime, so zero to rounding)
    tied = 2 * s0.dp_sync_s - 2 * (one.stages[0].dp_sync_s - s0.dp_sync_s) - s0.dp_sync_s
    assert -1e-12 <= tied < s0.dp_sync_s and one.stages[0].dp_sync_s > s0.dp_sync_s
    two = simulate(_plan(zero=2))
    assert two.stages[0].dp_sync_s == pytest.approx(s0.dp_sync_s)  # reduce-scatter + all-gather
    assert two.stages[0].peak_memory_bytes <= one.stages[0].peak_memory_bytes < s0.peak_memory_bytes


def test_plan_file_round_trip_keeps_the_levers():
    plan = _plan("selective", 2)
    data = plan.to_dict()
    assert data["stages"][0]["recompute"] == "selective" and data["stages"][0]["zero"] == 2
    assert "recompute" not in data["stages"][1] and "zero" not in data["stages"][1]
    back = plan_from_dict(data)
    assert back == plan
    assert dataclasses.replace(back.stages[0], zero_stage=0).zero_stage == 0
