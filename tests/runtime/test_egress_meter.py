"""The engine counts the bytes each rank sends across zones, and they are what the simulator
prices: a 2-stage plan whose first stage has a replica in each of two zones (its DP ring, its
activations to the one replica of the next stage and their gradients back, and the tied
embedding's sum all cross), trained on local processes."""

from __future__ import annotations

import json

import pytest

from sailor_core.network.model import default_network
from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime.egress_meter import EgressSlots
from sailor_core.runtime.launch import launch_local
from sailor_core.simulator.simulate import simulate

A, B = "us-central1-a", "us-central1-b"
STEPS = 3


def _plan(zero: int = 0):
    rep = lambda zone: {"gpu": "cpu", "tp": 1, "zone": zone}  # noqa: E731
    return plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
                           "stages": [{"layers": [0, 2], "replicas": [rep(A), rep(B)], "zero": zero},
                                      {"layers": [2, 4], "replicas": [rep(B)]}]})


def test_slots_sum_each_pair_and_report_only_pairs_that_moved():
    slots = EgressSlots.of(_plan(), 5, 0)
    assert slots.zones == (A, B) and slots.zone == A and slots.num_slots == 4
    status = [0.0] * (5 + slots.num_slots)
    slots.fill(status, {B: 10.0})
    slots.fill(status, {B: 2.5})
    assert slots.pairs(status) == [[A, B, 12.5]]
    one_zone = plan_from_dict({**_plan().to_dict(), "stages": [{"layers": [0, 4], "replicas": [
        {"gpu": "cpu", "tp": 1, "zone": A}]}]})
    assert EgressSlots.of(one_zone, 5, 0).num_slots == 0


# ZeRO's reduce-scatter and parameter all-gather cross the zones too (ZeRO-1: an all-reduce and an
# all-gather; ZeRO-2: a reduce-scatter and an all-gather)
@pytest.mark.parametrize("zero", [0, 1, 2])
def test_engine_counts_the_bytes_the_simulator_prices(corpus, tmp_path, zero):
    plan = _plan(zero)
    seen = {}
    res = launch_local(plan, STEPS, data=corpus, workdir=tmp_path, timeout_s=240,
                       on_started=lambda procs, path: seen.setdefault("metrics", path))
    assert res.status == "ok", (res.message, res.stderr_tails)
    lines = [json.loads(line) for line in seen["metrics"].read_text().splitlines() if line.strip()]
    steps = [line for line in lines if "step" in line and "loss" in line]
    assert len(steps) == STEPS
    per_step = [{(s, d): n for s, d, n in line["egress_bytes"]} for line in steps]
    assert set(per_step[0]) == {(A, B), (B, A)}
    assert all(p == per_step[0] for p in per_step)  # every step sends the same
    net = default_network()
    usd = sum(n * net.egress_usd_per_byte(s, d) for (s, d), n in per_step[0].items())
    assert usd == pytest.approx(simulate(plan).egress_usd_per_iteration, rel=1e-9)
