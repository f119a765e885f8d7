"""Plan -> nodes -> instances, and what the agents' reports mean (pure functions)."""

from __future__ import annotations

import dataclasses

import pytest

from sailor_core.job.nodes import RunningInstance, match_instances, nodes_for_plan, plan_usd_per_hr
from sailor_core.job.attempts import FINISHED, INSTANCE_PREEMPTED, LOST, RUNNING, WORKER_FAILED, classify_attempt
from sailor_core.catalog.instances import Offer
from sailor_core.errors import InfeasibleError
from sailor_core.job.protocol import AgentState, AgentStatus
from sailor_core.plan.types import plan_from_dict

ZONE = "us-central1-a"


def _offer(name: str, n: int, spot: float, zone: str = ZONE) -> Offer:
    return Offer(cloud="gcp", zone=zone, instance_type=name, gpu="A100-40", gpus_per_node=n,
                 spot_usd_per_hr=spot, on_demand_usd_per_hr=3 * spot)


def _plan(replicas_per_stage: list[list[int]], zone: str = ZONE):
    stages, start = [], 0
    for i, tps in enumerate(replicas_per_stage):
        end = start + (2 if i == 0 else 26 - start) if len(replicas_per_stage) > 1 else 26
        stages.append({"layers": [start, end], "replicas": [{"gpu": "A100-40", "tp": t, "zone": zone} for t in tps]})
        start = end
    return plan_from_dict({"model": "opt-350m", "global_batch_size": 8, "micro_batch_size": 1, "stages": stages})


def test_replicas_are_packed_on_the_cheapest_whole_nodes():
    plan = _plan([[1, 1], [1, 1]])  # four TP=1 replicas: ranks 0..3
    cheap_big = nodes_for_plan(plan, [_offer("x1", 1, 1.0), _offer("x4", 4, 3.0)])
    assert [(n.instance_type, n.ranks) for n in cheap_big] == [("x4", (0, 1, 2, 3))]
    assert plan_usd_per_hr(cheap_big) == 3.0
    cheap_small = nodes_for_plan(plan, [_offer("x1", 1, 0.5), _offer("x4", 4, 3.0)])
    assert [(n.instance_type, n.ranks) for n in cheap_small] == [("x1", (0,)), ("x1", (1,)), ("x1", (2,)), ("x1", (3,))]


def test_a_tp_group_never_spans_nodes():
    plan = _plan([[2]])
    with pytest.raises(InfeasibleError, match="2 A100-40 GPUs on one node"):
        nodes_for_plan(plan, [_offer("x1", 1, 0.1)])
    [node] = nodes_for_plan(plan, [_offer("x1", 1, 0.1), _offer("x4", 4, 3.0)])
    assert node.instance_type == "x4" and node.ranks == (0, 1)


def test_each_node_is_rented_as_the_smallest_shape_that_holds_its_gpus():
    # The case: a TP=2 replica of T4s rented an n1-standard-16 with 4 T4s while a 2-GPU shape exists.
    from sailor_core.catalog.instances import catalog_offers

    plan = plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 1, "stages": [
        {"layers": [0, 4], "replicas": [{"gpu": "T4", "tp": 2, "zone": ZONE}]}]})
    [node] = nodes_for_plan(plan, catalog_offers(gpus=["T4"], zones=[ZONE]))
    assert (node.instance_type, node.gpus_per_node) == ("n1-standard-8-t4x2", 2)
    assert node.why == "the smallest shape holding 2 T4"
    # Packed on the node size that is cheapest per GPU, and the last, part-filled node right-sized.
    three = _plan([[2, 2, 2]])
    nodes = nodes_for_plan(three, [_offer("x2", 2, 1.2), _offer("x4", 4, 2.0)])
    assert [(n.instance_type, n.ranks) for n in nodes] == [("x4", (0, 1, 2, 3)), ("x2", (4, 5))]
    # No shape of exactly its size: the idle GPUs are said.
    [node] = nodes_for_plan(_plan([[2]]), [_offer("x1", 1, 0.1), _offer("x4", 4, 3.0)])
    assert node.why == "no shape of exactly 2 A100-40 here: 2 of 4 GPUs idle"


def test_survivors_of_the_same_type_and_zone_are_kept_and_the_rest_ended():
    nodes = nodes_for_plan(_plan([[1, 1]]), [_offer("x1", 1, 0.5)])
    running = [RunningInstance(instance_id="i-b", zone=ZONE, instance_type="x1"),
               RunningInstance(instance_id="i-c", zone="us-central1-b", instance_type="x1")]
    placement = match_instances(nodes, running)
    assert [(n.ranks, i) for n, i in placement.keep] == [((0,), "i-b")]
    assert [n.ranks for n in placement.launch] == [(1,)]
    assert placement.surplus == ("i-c",)


def test_a_mixed_plan_rents_each_replica_on_its_market_priced_by_it():
    # Four TP=1 replicas in one pool, the first stage's on demand: packed apart, never on one node.
    from sailor_core.plan.types import with_on_demand

    plan = with_on_demand(_plan([[1, 1], [1, 1]]), {("A100-40", ZONE): 2})
    assert [r.market for s in plan.stages for r in s.replicas] == ["on_demand", "on_demand", "spot", "spot"]
    offers = [_offer("x1", 1, 1.0), _offer("x2", 2, 1.5), _offer("x4", 4, 3.0)]
    nodes = nodes_for_plan(plan, offers)
    assert [(n.instance_type, n.ranks, n.spot, n.usd_per_hr) for n in nodes] == [
        ("x2", (0, 1), False, 4.5), ("x2", (2, 3), True, 1.5)]
    assert plan_usd_per_hr(nodes) == 6.0
    # A spot job's plan with no market marked is all spot; an on-demand job's all on demand.
    assert {n.spot for n in nodes_for_plan(_plan([[1, 1], [1, 1]]), offers)} == {True}
    assert {(n.spot, n.usd_per_hr) for n in nodes_for_plan(_plan([[1, 1], [1, 1]]), offers, spot=False)} == {(False, 9.0)}
    # A running spot instance never serves an on-demand node (nor the other way round).
    running = [RunningInstance(instance_id="i-s", zone=ZONE, instance_type="x2"),
               RunningInstance(instance_id="i-o", zone=ZONE, instance_type="x2", spot=False)]
    placement = match_instances(nodes, running)
    assert [(n.ranks, i) for n, i in placement.keep] == [((0, 1), "i-o"), ((2, 3), "i-s")]
    placement = match_instances(nodes, running[:1])
    assert [n.ranks for n in placement.launch] == [(0, 1)] and [i for _, i in placement.keep] == ["i-s"]


def _status(gen: int, state: str, now: float = 100.0) -> AgentStatus:
    return AgentStatus(instance_id="i", generation=gen, state=AgentState(state), heartbeat_unix_s=now)


@pytest.mark.parametrize("statuses, clouds, kind", [
    ({"a": _status(2, "running"), "b": _status(2, "running")}, {"a": "running", "b": "running"}, RUNNING),
    ({"a": _status(2, "exited"), "b": _status(2, "exited")}, {"a": "running", "b": "running"}, FINISHED),
    ({"a": _status(2, "exited"), "b": _status(2, "running")}, {"a": "running", "b": "running"}, RUNNING),
    ({"a": _status(2, "failed"), "b": _status(2, "running")}, {"a": "running", "b": "preempted"}, INSTANCE_PREEMPTED),
    ({"a": _status(2, "preempted"), "b": _status(2, "failed")}, {"a": "running", "b": "running"}, INSTANCE_PREEMPTED),
    ({"a": _status(2, "preempting"), "b": _status(2, "running")}, {"a": "running", "b": "running"}, RUNNING),
    ({"a": _status(2, "failed"), "b": _status(2, "running")}, {"a": "running", "b": "running"}, WORKER_FAILED),
    ({"a": _status(2, "running"), "b": None}, {"a": "running", "b": None}, LOST),
    ({"a": _status(2, "running", now=0.0), "b": _status(2, "running")}, {"a": "running", "b": "running"}, LOST),
    ({"a": _status(0, "exited"), "b": _status(2, "running")}, {"a": "running", "b": "running"}, RUNNING),
])
def test_classify_attempt(statuses, clouds, kind):
    outcome = classify_attempt(generation=2, statuses=statuses, cloud_states=clouds, now_unix_s=100.0,
                               heartbeat_timeout_s=30.0)
    assert outcome.kind == kind, outcome


def test_a_failed_worker_is_named_with_its_exit_codes():
    failed = AgentStatus(instance_id="a", generation=2, state=AgentState.FAILED, exit_codes={0: 0, 1: 77},
                         heartbeat_unix_s=100.0)
    outcome = classify_attempt(generation=2, statuses={"a": failed}, cloud_states={"a": "running"},
                               now_unix_s=100.0)
    assert (outcome.kind, outcome.instance_ids) == (WORKER_FAILED, ("a",))
    assert outcome.reason == "worker exited non-zero: {'a': {'0': 0, '1': 77}}"


def test_an_agent_status_carries_the_generations_egress_versioned():
    import json

    from sailor_core.job.protocol import EGRESS_VERSION, ProtocolError, read_metrics_line

    st = AgentStatus(instance_id="i", generation=3, state=AgentState.RUNNING,
                     egress=(("us-east-1a", "us-east-1b", 12.5),))
    data = json.loads(json.dumps(st.to_dict()))
    assert data["egress"] == {"version": EGRESS_VERSION, "pairs": [["us-east-1a", "us-east-1b", 12.5]]}
    assert AgentStatus.from_dict(data) == st
    assert "egress" not in AgentStatus(instance_id="i", generation=3, state=AgentState.RUNNING).to_dict()
    data["egress"]["version"] = EGRESS_VERSION + 1  # a meaning this reader does not know: absent
    assert AgentStatus.from_dict(data).egress == ()
    line = read_metrics_line(json.dumps({"step": 2, "loss": 1.0, "egress_bytes": [["a", "b", 4.0]]}))
    assert line.egress_bytes == (("a", "b", 4.0),)
    # any rank's bytes that no step line carried (a generation ended before its first step)
    event = read_metrics_line(json.dumps({"event": "egress", "rank": 1, "egress_bytes": [["b", "c", 8]]}))
    assert event.kind == "egress" and event.egress_bytes == (("b", "c", 8.0),)
    with pytest.raises(ProtocolError):
        _ = read_metrics_line(json.dumps({"event": "egress", "egress_bytes": [["b", "c"]]})).egress_bytes


def test_an_agent_status_says_how_many_standby_workers_are_ready():
    import json

    st = AgentStatus(instance_id="i", generation=-1, state=AgentState.IDLE, num_standby=2, num_standby_ready=1)
    data = json.loads(json.dumps(st.to_dict()))
    assert (data["num_standby"], data["num_standby_ready"]) == (2, 1)
    assert AgentStatus.from_dict(data) == st
    assert st.standby_starting  # before its first assignment, one still imports
    assert not dataclasses.replace(st, num_standby_ready=2).standby_starting
    assert not dataclasses.replace(st, generation=1).standby_starting  # given work already: nothing to wait for
    # An agent older than the field (or one without standby workers): nothing to wait for.
    del data["num_standby"], data["num_standby_ready"]
    old = AgentStatus.from_dict(data)
    assert (old.num_standby, old.num_standby_ready, old.standby_starting) == (0, 0, False)
