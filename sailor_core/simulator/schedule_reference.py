"""Exact event-driven 1F1B schedules: the model the closed form (``pipeline_time``), and through
it the planner's bounds, are tested against.  Op by op, so slow: only tests run it.

Two semantics, each op by op:

* ``engine_makespan``: what the engine (``runtime/trainer.py``) does.  Every rank runs the
  engine's own op list (``runtime/pipeline_order.rank_op_order``: local micro-batches m mod D,
  lookahead (P - i - 1) max D).  Sends never block (``isend``).  A transfer is a rendezvous, as NCCL's and gloo's are: it starts
  when the sender has sent, the receiver has posted its receive and the link (one FIFO per
  direction of each replica pair) is free, occupies the link for ``wire`` seconds and arrives
  ``latency`` later.  With ``prefetch`` (the engine since this model) the receive of an op's
  input is posted as soon as the rank's previous op of the same kind ended (the first of each
  kind at the step's start), so the transfer overlaps whatever the rank runs in between;
  without it the receive is posted when the rank reaches the op (a blocking ``recv``).
* ``blocking_makespan``: DeepSpeed's pipeline engine (Sailor's measurements): its lock-step
  ``TrainSchedule`` with blocking sends and receives; a send and its receive start together
  when both sides reached them and both wait for the whole transfer.

Links are given per stage boundary as (latency s, wire s) one way, the same both ways.
"""

from __future__ import annotations

# The engine's op order (pure, no torch): the reference replays exactly what the engine runs.
from sailor_core.runtime.pipeline_order import rank_op_order


def engine_makespan(steps, num_mb: int, links, *, prefetch: bool = True, ahead=None) -> float:
    """Pipeline time under the engine's semantics (module doc).

    ``steps[s][r]`` = (forward s, backward s) of replica r of stage s; ``links[s]`` = (latency,
    wire) of every replica pair between stage s and s + 1."""
    num_stages = len(steps)
    dps = [len(s) for s in steps]
    ops = {(s, r): rank_op_order(num_mb, dps, s, r) for s in range(num_stages) for r in range(dps[s])}
    pos = {k: 0 for k in ops}
    free = {k: 0.0 for k in ops}
    ends = {(k, kind): [] for k in ops for kind in "FB"}
    sent: dict[tuple[str, int, int], float] = {}  # (kind, stage that sent, m) -> send time
    link_free: dict[tuple, float] = {}
    remaining = sum(len(v) for v in ops.values())
    while remaining:
        progressed = False
        for key, order in ops.items():
            s, r = key
            while pos[key] < len(order):
                kind, m = order[pos[key]]
                src_stage = s - 1 if kind == "F" else s + 1
                ready = free[key]
                if 0 <= src_stage < num_stages:
                    msg = (kind, src_stage, m)
                    if msg not in sent:
                        break
                    done = ends[(key, kind)]
                    depth = (ahead(s) if ahead is not None else 1)
                    post = (done[len(done) - depth] if len(done) >= depth else 0.0) if prefetch else free[key]
                    src = (src_stage, m % dps[src_stage])
                    lat, wire = links[min(s, src_stage)]
                    lkey = (src, key, kind)
                    start = max(sent[msg], post, link_free.get(lkey, 0.0))
                    link_free[lkey] = start + wire
                    ready = max(ready, start + wire + lat)
                f, b = steps[s][r]
                end = ready + (f if kind == "F" else b)
                free[key] = end
                ends[(key, kind)].append(end)
                if (kind == "F" and s + 1 < num_stages) or (kind == "B" and s > 0):
                    sent[(kind, s, m)] = end
                pos[key] += 1
                remaining -= 1
                progressed = True
        assert progressed, "deadlock in the engine's schedule"
    return max(free.values())


def deepspeed_commands(num_stages: int, stage: int, num_mb: int) -> list[tuple[str, int]]:
    """DeepSpeed's ``TrainSchedule`` for one stage: its lock-step list of sends, receives,
    forwards and backwards (even and odd stages alternate forward and backward steps)."""

    def step_to_mb(step: int) -> tuple[int, bool]:
        even_step, even_stage = step % 2 == 0, stage % 2 == 0
        if even_step and even_stage:
            return step // 2 - stage // 2, True
        if not even_step and not even_stage:
            return (step - 1) // 2 - stage // 2, True
        if even_step and not even_stage:
            return step // 2 - num_stages + (stage + 1) // 2, False
        return (step - 1) // 2 - num_stages + 1 + stage // 2, False

    def valid(m: int) -> bool:
        return 0 <= m < num_mb

    cmds: list[tuple[str, int]] = []
    prev = -1
    has_prev, has_next = stage > 0, stage < num_stages - 1
    for step in range(2 * (num_mb + num_stages - 1)):
        m, forward = step_to_mb(step)
        if forward:
            if valid(prev) and has_prev:
                cmds.append(("send_grad", prev))
            if valid(m) and has_prev:
                cmds.append(("recv_act", m))
        else:
            if valid(m) and has_next:
                cmds.append(("recv_grad", m))
            if valid(prev) and has_next:
                cmds.append(("send_act", prev))
        if valid(m):
            cmds.append(("F" if forward else "B", m))
        prev = m
    return cmds


_MATCH = {"send_act": ("recv_act", 1), "recv_act": ("send_act", -1),
          "send_grad": ("recv_grad", -1), "recv_grad": ("send_grad", 1)}


def blocking_makespan(steps, num_mb: int, links) -> float:
    """Pipeline time of one pipeline (one replica per stage) under DeepSpeed's blocking
    semantics (module doc); ``steps[s]`` = (forward, backward), ``links[s]`` = (latency, wire)."""
    num_stages = len(steps)
    cmds = [deepspeed_commands(num_stages, s, num_mb) for s in range(num_stages)]
    pos, free = [0] * num_stages, [0.0] * num_stages
    link_free: dict[tuple[int, str], float] = {}
    remaining = sum(len(c) for c in cmds)
    while remaining:
        progressed = False
        for s in range(num_stages):
            while pos[s] < len(cmds[s]):
                kind, m = cmds[s][pos[s]]
                if kind in ("F", "B"):
                    free[s] += steps[s][0 if kind == "F" else 1]
                    pos[s] += 1
                    remaining -= 1
                    progressed = True
                    continue
                want, step = _MATCH[kind]
                peer = s + step
                if pos[peer] >= len(cmds[peer]) or cmds[peer][pos[peer]] != (want, m):
                    break
                lat, wire = links[min(s, peer)]
                direction = (min(s, peer), "act" if kind.endswith("act") else "grad")
                start = max(free[s], free[peer], link_free.get(direction, 0.0))
                link_free[direction] = start + wire
                free[s] = free[peer] = start + wire + lat
                pos[s] += 1
                pos[peer] += 1
                remaining -= 2
                progressed = True
        assert progressed, "deadlock in DeepSpeed's schedule"
    return max(free)
