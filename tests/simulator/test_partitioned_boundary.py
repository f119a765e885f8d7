"""DeepSpeed's partitioned boundary tensors under TP (issue 35, kind 1): a meta tensor before each
slice and two all-gathers over the TP group per micro-batch (Sailor's pipeline engine: the
received activation and the received gradient), charged to the boundary of a
blocking (DeepSpeed) regime only, in ``simulate`` and the planner's fast path alike."""

from __future__ import annotations

import pytest

from sailor_core.catalog.models import get_model
from sailor_core.network.model import default_network
from sailor_core.plan.types import plan_from_dict
from sailor_core.profiles import default_profile_db
from sailor_core.profiles.estimator import DEFAULT_TP_LATENCY_S
from sailor_core.regimes import get_regime
from sailor_core.simulator import compose, simulate, stage_memory
from sailor_core.simulator import stage as st

ZONE = "us-central1-a"
NBYTES = 8_388_608.0


def _ends(gpu: str, tp_src: int, tp_dst: int):
    return st.endpoint(ZONE, gpu, tp_src), st.endpoint(ZONE, gpu, tp_dst)


def test_only_deepspeed_partitions():
    assert compose.partitions_boundaries(get_regime("megatron-fp32-adamw"))
    assert not compose.partitions_boundaries(get_regime("torch-bf16-autocast-adamw"))
    assert not compose.partitions_boundaries(get_regime("torch-fp32-adamw"))


def test_two_tp_gathers_and_two_meta_messages():
    net = default_network()
    src, dst = _ends("GH-96", 4, 4)
    extra = st.partitioned_boundary_s(net, NBYTES, src, dst)
    # each gather a ring of tp - 1 steps of a quarter of the tensor, one latency; then two meta sends
    gather = DEFAULT_TP_LATENCY_S + 3 * NBYTES / 4 / net.tp_bandwidth_bytes_per_s("GH-96", 4, NBYTES)
    assert extra == pytest.approx(2 * gather + net.p2p_time_s(64, src, dst) + net.p2p_time_s(64, dst, src))
    plain = st.boundary_transfer_s(net, NBYTES, src, dst)
    assert st.boundary_transfer_s(net, NBYTES, src, dst, partitioned=True) == pytest.approx(plain + extra)
    # larger tensors take longer to gather
    assert st.partitioned_boundary_s(net, 2 * NBYTES, src, dst) > extra


@pytest.mark.parametrize("tps", [(1, 1), (2, 4)])
def test_no_partition_without_equal_tp(tps):
    net = default_network()
    src, dst = _ends("GH-96", *tps)
    assert st.partitioned_boundary_s(net, NBYTES, src, dst) == 0.0
    assert (st.boundary_transfer_s(net, NBYTES, src, dst, partitioned=True)
            == st.boundary_transfer_s(net, NBYTES, src, dst))


def _plan(num_stages: int, regime: str, tp: int = 4) -> dict:
    cuts = [round(i * 26 / num_stages) for i in range(num_stages + 1)]
    return {"model": "opt-350m", "global_batch_size": 16, "micro_batch_size": 1, "regime": regime,
            "stages": [{"layers": [cuts[i], cuts[i + 1]], "replicas": [{"gpu": "GH-96", "tp": tp, "zone": ZONE}]}
                       for i in range(num_stages)]}


def test_simulate_charges_deeper_deepspeed_pipelines_more(monkeypatch):
    def ratio(num_stages: int) -> float:
        plan = plan_from_dict(_plan(num_stages, "megatron-fp32-adamw"))
        with_parts = simulate(plan).iteration_time_s
        monkeypatch.setattr(compose, "partitions_boundaries", lambda regime: False)
        without = simulate(plan).iteration_time_s
        monkeypatch.undo()
        return with_parts / without

    one, two, four = ratio(1), ratio(2), ratio(4)
    assert one == 1.0  # no boundary
    assert 1.0 < two < four  # every boundary adds its gathers on every micro-batch


def test_engine_regime_unchanged(monkeypatch):
    plan = plan_from_dict(_plan(4, "torch-bf16-autocast-adamw"))
    before = simulate(plan).iteration_time_s
    monkeypatch.setattr(compose, "partitions_boundaries", lambda regime: False)
    assert simulate(plan).iteration_time_s == before



def test_memory_reports_what_the_allocator_sees():
    # the regime's constant overhead (the CUDA context) is invisible to max_memory_allocated
    regime = get_regime("torch-bf16-autocast-adamw")
    layers = get_model("opt-350m").num_layer_indices
    mem = stage_memory(default_profile(), 0, layers, 2, regime, 1 << 40).to_dict()
    assert mem["allocated_bytes"] == mem["peak_memory_bytes"] - regime.constant_overhead_bytes > 0


def default_profile():
    return default_profile_db().get("opt-350m", "GH-96", 4, 1, regime="torch-bf16-autocast-adamw")
