"""Point to point between pipeline stages: a rank's sends and receives of activations and their
gradients, and the step's inbox of receives posted ahead.

Tags: micro-batch ``m``'s activation travels with tag ``2 m`` (downstream, over the ``fwd``
group), its gradient with ``2 m + 1`` (upstream, over ``bwd``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sailor_core.plan.layout import RankRole, replica_ranks
from sailor_core.plan.routing import replica_of
from sailor_core.plan.types import Plan
from sailor_core.runtime import links
from sailor_core.runtime.process_groups import Groups


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePeers:
    """One rank's transfers with the replicas of the stages next to it."""

    plan: Plan
    role: RankRole
    groups: Groups
    device: torch.device
    act_shape: tuple[int, int, int]  # a boundary tensor's: (micro-batch, sequence, hidden)

    def _peer_ranks(self, stage: int, m: int) -> list[int]:
        dp = self.plan.stages[stage].dp_degree
        return replica_ranks(self.plan, stage, replica_of(m, dp))

    def send(self, tensor: torch.Tensor, stage: int, m: int, tag: int, group, sends: list) -> list:
        """Send ``tensor`` (this replica's output or its input's gradient, the same on each of its
        TP ranks) to the replica of ``stage`` that gets micro-batch ``m``; the works go to ``sends``.
        Equal TP degrees: TP rank t sends the t-th slice to rank t, which gathers them over its
        TP group (Megatron's scatter-gather: the tensor crosses the network once, over every TP
        pair); otherwise whole copies, receiver r's from TP rank r mod this TP degree.  Returns
        the entries it added to ``sends``."""
        _drop_completed(sends)
        peers = self._peer_ranks(stage, m)
        t, k = self.role.tp_rank, self.role.tp_degree
        if _sliced(k, len(peers), tensor.numel()):
            targets = [(peers[t], tensor.reshape(-1).chunk(k)[t].contiguous())]
        else:
            payload = tensor.contiguous()
            targets = [(dst, payload) for dst in peers[t::k]]
        mine = [(links.isend(payload, dst=dst, tag=tag, group=group), payload) for dst, payload in targets]
        sends.extend(mine)
        return mine

    def post_recv(self, stage: int, m: int, tag: int, group) -> tuple[object, torch.Tensor, bool]:
        """Post the receive of micro-batch ``m``'s tensor from ``stage`` (see ``send``): its work,
        its buffer and whether that holds this rank's slice only."""
        peers = self._peer_ranks(stage, m)
        t, k = self.role.tp_rank, self.role.tp_degree
        numel = math.prod(self.act_shape)
        if _sliced(len(peers), k, numel):
            buf = torch.empty(numel // k, device=self.device)
            return links.irecv(buf, src=peers[t], tag=tag, group=group), buf, True
        buf = torch.empty(self.act_shape, device=self.device)
        return links.irecv(buf, src=peers[t % len(peers)], tag=tag, group=group), buf, False

    def received(self, work, buf: torch.Tensor, sliced: bool) -> torch.Tensor:
        """The whole tensor of a posted receive, once it arrived (slices gathered over TP)."""
        work.wait()
        if not sliced:
            return buf
        parts = [torch.empty_like(buf) for _ in range(self.role.tp_degree)]
        dist.all_gather(parts, buf, group=self.groups.tp)
        return torch.cat(parts).view(self.act_shape)


def _drop_completed(sends: list) -> None:
    """Forget the sends that report completion (NCCL's do as their kernels finish; gloo's only
    once waited, hence ``retire`` where the schedule says a send has arrived).  A payload lives
    until its send completes, not to the step's end: the first stage would otherwise hold every
    micro-batch's output."""
    sends[:] = [s for s in sends if not s[0].is_completed()]


def retire(sends: list, entries: list) -> None:
    """Wait for ``entries`` (sends known to have arrived, so the wait returns at once) and forget
    them: their payloads are freed even where the backend never reports a send complete."""
    for work, _ in entries:
        work.wait()
    sends[:] = [s for s in sends if all(s is not e for e in entries)]


def _sliced(tp_src: int, tp_dst: int, numel: int) -> bool:
    """Whether a boundary tensor travels in TP slices (``StagePeers.send``)."""
    return tp_src == tp_dst > 1 and numel % tp_src == 0


class Inbox:
    """One step's receives, each posted as soon as the rank's previous op of its kind is done (the
    first of each kind at the step's start): the transfer then overlaps the op of the other kind
    that 1F1B runs in between, where a receive posted only when its op is reached would keep the
    whole transfer on the critical path (``simulator/pipeline_time``, schedule "prefetch").
    Posting after the op's own sends keeps every group's sends and receives in the order they
    had with a blocking receive: NCCL runs a communicator's operations in order on one stream."""

    def __init__(self, peers: StagePeers, schedule: list[tuple[str, int]], *, first: bool, last: bool) -> None:
        self.peers = peers
        self.queues = {"F": [] if first else [m for k, m in schedule if k == "F"],
                       "B": [] if last else [m for k, m in schedule if k == "B"]}
        self.posted = {"F": 0, "B": 0}
        self.pending: dict[tuple[str, int], tuple[object, torch.Tensor, bool]] = {}
        self.done("F")
        self.done("B")

    def done(self, kind: str) -> None:
        """The rank finished an op of ``kind`` (and posted its sends): post the next receive."""
        queue, i = self.queues[kind], self.posted[kind]
        if i == len(queue):
            return
        self.posted[kind] = i + 1
        p, m = self.peers, queue[i]
        if kind == "F":
            self.pending[(kind, m)] = p.post_recv(p.role.stage - 1, m, 2 * m, p.groups.fwd)
        else:
            self.pending[(kind, m)] = p.post_recv(p.role.stage + 1, m, 2 * m + 1, p.groups.bwd)

    def take(self, kind: str, m: int) -> torch.Tensor:
        """The input of op (``kind``, ``m``): its activation (F) or its output's gradient (B)."""
        return self.peers.received(*self.pending.pop((kind, m)))
