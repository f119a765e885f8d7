"""The flow charges the egress the agents report, priced per pair by the network model, once."""

from __future__ import annotations

import pytest

from sailor_core.job import state as js
from sailor_core.job.protocol import AgentState, AgentStatus
from sailor_core.job.spec import JobSpec
from sailor_core.network.model import default_network


def test_agents_egress_is_charged_at_the_network_models_prices_once():
    from tasks.workers import _merge_progress

    a, b, c = "us-central1-a", "us-central1-b", "us-east-1a"
    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=10), job_id="eg")
    old = AgentStatus(instance_id="i", generation=1, state=AgentState.EXITED, egress=((a, b, 2e9),))
    now = AgentStatus(instance_id="i", generation=2, state=AgentState.RUNNING, step=3, losses=((3, 1.0),),
                      egress=((a, c, 1e9),), previous=old)
    s = _merge_progress(s, {"i": now}, 2)
    s = _merge_progress(s, {"i": now}, 2)  # read again: charged once
    net = default_network()
    pairs = s.ledger().egress_by_pair()
    assert pairs == {(a, b): (2e9, pytest.approx(2e9 * net.egress_usd_per_byte(a, b))),
                     (a, c): (1e9, pytest.approx(1e9 * net.egress_usd_per_byte(a, c)))}
    assert net.egress_usd_per_byte(a, c) > net.egress_usd_per_byte(a, b) > 0  # across clouds dearer than zones
    assert s.steps_done == 3
