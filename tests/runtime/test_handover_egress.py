"""The state handed over at a plan change is metered where it crosses zones (runtime/handover.py
sends through runtime/links.py): real gloo ranks in three zones, the meter against every byte the
backend was actually given; a receiver with a holder in its own zone takes its state from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailor_core.ports import free_port

from .handover_egress_ranks import GENERATIONS
from .rank_scripts import run_rank_scripts


@pytest.mark.slow  # four processes importing torch: ~30 s on the shared 2 cores
def test_handover_bytes_across_zones_are_metered_as_sent(corpus, tmp_path: Path):
    got = run_rank_scripts("handover_egress_ranks.py", len(GENERATIONS[-1]), corpus, tmp_path)
    zones = got[0]["zones"]
    assert [r["state_from"] for r in got] == ["memory", "memory", "peers", "peers"]
    across, within = {}, 0
    for r in got:
        for dst, n in r["sent"].items():
            if zones[int(dst)] != zones[r["rank"]]:
                key = (zones[r["rank"]], zones[int(dst)])
                across[key] = across.get(key, 0) + n
            else:
                within += n
        for dst_zone, n in r["metered"].items():
            across[(zones[r["rank"]], dst_zone)] = across.get((zones[r["rank"]], dst_zone), 0) - n
    # the meter counted every byte that crossed zones, and nothing else
    assert across and all(n == 0 for n in across.values()), across
    metered = {(zones[r["rank"]], d): n for r in got for d, n in r["metered"].items()}
    # the new rank in B took its state from B's holder (no egress); C's, from a holder in A or B
    assert set(metered) <= {(zones[0], zones[3]), (zones[1], zones[3])} and metered and within > 0


def test_a_generation_ended_before_its_first_step_reports_its_handover_once(corpus, tmp_path: Path):
    """The handover's bytes ride in the first step's status all-reduce; a generation that ends
    before it has one (here: already at its last step) reports them in its ranks' ``egress`` lines,
    which the agent adds to the generation's egress, once."""
    import os
    import signal

    from sailor_core.catalog.layers import layer_shapes
    from sailor_core.catalog.models import get_model
    from sailor_core.job.protocol import AgentAction, AgentAssignment, AgentState, write_assignment
    from sailor_core.plan.types import plan_from_dict
    from tests.flows.test_agent import _wait_status

    from .conftest import make_plan
    from .test_parked_workers import TOTAL_STEPS, ZONE_A, ZONE_B, _agent, _run

    job_url, ckpt, port = str(tmp_path / "job"), str(tmp_path / "ckpt"), free_port()
    agent = _agent(tmp_path, job_url, "i-a")
    try:
        narrow = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])])
        write_assignment(job_url, "i-a", _run(1, narrow, (0, 1), 2, port, corpus, ckpt, TOTAL_STEPS))
        _wait_status(job_url, "i-a", lambda st: st.step is not None and st.step >= 2)
        write_assignment(job_url, "i-a", AgentAssignment(generation=2, action=AgentAction.STOP))
        parked = _wait_status(job_url, "i-a", lambda st: st.generation == 2).previous
        # the stage boundary moves across two zones; its --steps is the checkpoint's step: no step runs
        moved = plan_from_dict({**narrow.to_dict(), "stages": [
            {"layers": [lo, hi], "replicas": [{"gpu": "cpu", "tp": 1, "zone": zone}]}
            for lo, hi, zone in ((0, 1, ZONE_A), (1, 4, ZONE_B))]})
        write_assignment(job_url, "i-a", _run(3, moved, (0, 1), 2, port, corpus, ckpt, parked.step))
        gen3 = _wait_status(job_url, "i-a", lambda st: st.generation == 3 and st.state == AgentState.EXITED)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    assert gen3.pids == parked.pids and gen3.exit_codes == {0: 0, 1: 0} and gen3.step is None
    assert "handed over by its peers" in (Path(gen3.log_dir) / "rank1.log").read_text()
    lines = [json.loads(line) for line in (Path(gen3.log_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in lines if "egress_bytes" in r and "event" not in r] == []  # no step line
    # layer 1 and the tied matrix (weights and both AdamW moments, float32), from zone A to B, once
    spec = get_model("tiny")
    handed = (layer_shapes("tiny", seq_len=1)[1].params + spec.vocab_size * spec.hidden_size) * 3 * 4
    assert [r for r in lines if r.get("event") == "egress"] == [
        {"event": "egress", "rank": 0, "egress_bytes": [[ZONE_A, ZONE_B, handed]]}]
    assert gen3.egress == ((ZONE_A, ZONE_B, handed),)
