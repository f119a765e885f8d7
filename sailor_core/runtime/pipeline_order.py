"""The 1F1B order of forward and backward passes on one rank (pure, no torch).

A stage's replica processes its micro-batches (``plan.routing.local_microbatches``)
forwards in increasing order and backwards in increasing order; the backward
of ``m`` runs once every local micro-batch up to ``m + lookahead`` has been
forwarded.  With ``lookahead = (S - i - 1) * D`` and equal replica counts this
is exactly 1F1B (``S - i - 1`` warm-up forwards, then alternate).  With
different replica counts per stage we use ``(S - i - 1) * max_j D_j``: any
lookahead that does not grow along the pipeline is deadlock-free (each rank
only ever waits on a backward of a strictly earlier micro-batch or on a
forward another rank is bound to produce), given non-blocking sends.
"""

from __future__ import annotations

# The routing rule's home is plan/routing; the trainer takes the rank's micro-batches from here.
from sailor_core.plan.routing import local_microbatches, replica_of


def stage_lookahead(stage: int, dp_degrees: list[int]) -> int:
    return (len(dp_degrees) - stage - 1) * max(dp_degrees)


def one_f_one_b_order(local: list[int], lookahead: int) -> list[tuple[str, int]]:
    """[("F", m) | ("B", m), ...] for one rank."""
    ops: list[tuple[str, int]] = []
    next_fwd = 0
    for m in local:
        while next_fwd < len(local) and local[next_fwd] <= m + lookahead:
            ops.append(("F", local[next_fwd]))
            next_fwd += 1
        ops.append(("B", m))
    return ops


def rank_op_order(num_microbatches: int, dp_degrees: list[int], stage: int,
                  replica: int) -> list[tuple[str, int]]:
    """The order in which replica ``replica`` of ``stage`` runs its forwards and backwards: what the
    engine runs and what the simulator's exact reference (``simulator/schedule_reference``) replays."""
    return one_f_one_b_order(local_microbatches(num_microbatches, dp_degrees[stage], replica),
                             stage_lookahead(stage, dp_degrees))


def gradients_known_arrived(num_microbatches: int, dp_degrees: list[int], stage: int,
                            replica: int) -> dict[int, list[int]]:
    """For a replica of ``stage`` >= 1: ``{m2: [m, ...]}``, the micro-batches ``m`` whose input
    gradient it sent upstream that have surely arrived once it takes the forward input of
    ``m2``.  The upstream replica of ``m`` sends ``m2`` (routed here) after its backward of
    ``m``, which needed that gradient.  Backends whose sends never report completion (gloo)
    can free a gradient payload then rather than at the step's end; a gradient with no such
    ``m2`` is left to the step's end."""
    if stage < 1:
        return {}
    up_dp, here_dp = dp_degrees[stage - 1], dp_degrees[stage]
    out: dict[int, list[int]] = {}
    for up in range(up_dp):
        pending: list[int] = []  # backwards of upstream ``up`` whose gradient came from here
        for kind, m in rank_op_order(num_microbatches, dp_degrees, stage - 1, up):
            if kind == "B" and replica_of(m, here_dp) == replica:
                pending.append(m)
            elif kind == "F" and pending and replica_of(m, here_dp) == replica:
                out.setdefault(m, []).extend(pending)
                pending = []
    return out
