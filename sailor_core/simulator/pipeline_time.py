"""Iteration time of a 1F1B pipeline whose stages and links run at different speeds.

Stage k's replica r takes ``t_r`` per micro-batch (forward + backward) and gets ``n_r``
micro-batches (micro-batch m -> replica m mod D).  The stage's step is its straggler,
``t_k = max_r t_r`` (forward ``f_k``, backward ``b_k``), its steady-state work
``R_k = max_r (n_r - 1) t_r``, ``n_k = max_r n_r``.  Link k (to stage k+1) takes ``l_k`` per
micro-batch for the activation forward plus the gradient back, ``lam_k = l_k / 2`` each way.

What a link costs depends on how the framework moves the tensors (``P2P_SCHEDULES``):

* ``"prefetch"``, Sailor's engine (``runtime/trainer.py``): sends never block; every transfer
  is a rendezvous (it starts once the receive is posted, as NCCL's and gloo's do), and a rank
  posts the receive of its next op's input as soon as its previous op of that kind is done, so
  a transfer overlaps the op of the other kind in between, not the op that posted it.
* ``"blocking"``, DeepSpeed's pipeline engine (Sailor's measured runs): sends and receives both
  block, so a stage spends both directions of both its links on every micro-batch.

Under 1F1B stage k runs ``w_k = min(P - k - 1, n_k - 1)`` warm-up forwards, ``s_k = n_k - 1 -
w_k`` steady forward+backward pairs after its first backward, and ``w_k`` cool-down backwards.
Following the critical path through stage k gives a candidate time

    T_k = B_k + G_k + b_k + S_k + w_k C_k
    B_k = sum_{j<k} (t_j + l_j)            the first micro-batch reaching k, the last leaving it
    G_k = max(f_k + e_k + w_k W_k,         from k's first forward to its first backward: its
              f_k + l_k + G_{k+1} + b_{k+1})  warm-up, or the round trip beyond k (recursively,
                                           so a later stage's slow warm-up is counted)
    C_k = max_{j>=k} c_j                   a cool-down backward: the slowest pace behind k
    S_k = max(own steady work, windows)

with, per schedule (``lam_in``, ``lam_out``: the one-way times of k's input and output link):

    prefetch:  W = f + lam_in    (the next warm-up input is only posted after a forward)
               c = b + lam_out   e = 0
               own = max(R_k - w_k t_k, s_k max(f + lam_in, b + lam_out))
    blocking:  W = f + lam_in + lam_out   c = b + lam_in + lam_out   e = lam_out
               own = max(0, R_k - w_k t_k) + s_k (l_in + l_out)

and the cycles through neighbouring stages: a window of stages i..j around k carrying a
micro-batch forward and its gradient back has mean ``a = (sum t + sum l) / (j - i + 1)`` per
micro-batch (two neighbours: the pair period of 1F1B; longer windows when links are slow and the
stages between them fast), so the best window (and each neighbour pair, which the planner's
bounds count on) gives ``s_k a``.  With unequal replica counts a cycle spans more of a narrow
stage's micro-batches: the engine's lookahead counts in the widest stage's (``_cycles_s``).
A link is also a resource of its own: its busiest NIC carries ``n`` micro-batches, one
direction each taking ``l / 2`` (full duplex).  The pipeline time is the largest candidate.

Checked against exact event-driven schedules of both semantics (``schedule_reference``):
on random pipelines of 1-8 stages, 1-32 micro-batches and links up to the stages' own time
(latency and bandwidth apart) the median error is 0 and the extremes -4 % / +6 % (prefetch),
-6 % / +2 % (blocking); with links three times a stage's forward, -5 % / +10 % and -11 % / 0 %.
Uniform pipelines of 2-8 stages with slow links: 0 to +7 %.  Replicas of different speeds:
the straggler's step stands for all of a stage's replicas, +0.5 % median, up to +30 %.

Named parts (they sum to the pipeline time): ``compute`` is the busiest stage's own work
``max_r n_r t_r``; ``bubble`` what the schedule adds without any transfer time (warm-up,
cool-down, waiting for slower neighbours); ``p2p`` what the transfers add on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# Backward is about twice the forward (input and weight gradients): the forward share of a
# step when a caller does not say.
DEFAULT_FORWARD_SHARE = 1.0 / 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTime:
    compute_s: float
    bubble_s: float
    p2p_s: float
    busiest_stage: int
    bottleneck: str  # "stage <i>" or "link <i>-><i+1>"

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + self.p2p_s


@dataclass(frozen=True, slots=True)
class StageTiming:
    """A stage as a pipeline resource (see the module doc)."""

    step_s: float  # the straggler's forward + backward of one micro-batch
    busy_s: float  # max_r n_r t_r: the busiest replica's work in one iteration
    repeat_s: float  # max_r (n_r - 1) t_r: its steady-state share
    fwd_s: float = 0.0  # the straggler's forward (warm-up forwards hide part of the first round trip)
    num_microbatches: int = 1  # the most any replica gets


def stage_timing(
    replica_step_s: Sequence[float],
    replica_counts: Sequence[int],
    replica_fwd_s: Sequence[float] | None = None,
) -> StageTiming:
    """Combine a stage's replicas: per-micro-batch times ``t_r``, micro-batch counts ``n_r`` and
    (optionally) forward times; without them the forward is taken as a third of the step."""
    step = busy = repeat = 0.0
    straggler = 0
    most = 0
    r = 0
    for t, n in zip(replica_step_s, replica_counts):
        if t > step and n > 0:  # a replica without micro-batches waits for none of them
            step, straggler = t, r
        work = n * t
        if work > busy:
            busy = work
        if n > 0:
            rep = (n - 1) * t
            if rep > repeat:
                repeat = rep
        if n > most:
            most = n
        r += 1
    fwd = replica_fwd_s[straggler] if replica_fwd_s is not None else step * DEFAULT_FORWARD_SHARE
    return StageTiming(step, busy, repeat, fwd, most if most > 1 else 1)


P2P_SCHEDULES = ("prefetch", "blocking")


def _longest(stages: Sequence[StageTiming], link_s: Sequence[float], link_counts: Sequence[int],
             schedule: str = "prefetch") -> tuple[float, str]:
    best, k, at_link, _ = _longest_both(stages, link_s, link_counts, schedule)
    return best, (f"link {k}->{k + 1}" if at_link else f"stage {k}")


def _windows(steps: Sequence[float], link_s: Sequence[float]) -> list[tuple[float, int]]:
    """For every stage, the window of two or more neighbouring stages around it whose round trip
    has the largest mean per stage: (steps + links of the window, stages in it), (0, 1) if none.
    O(P^2): per window start i, the best window ending at or after each stage, from the end."""
    p = len(steps)
    before = [0.0] * (p + 1)  # sum_{h<x} (t_h + l_h)
    for h in range(p):
        before[h + 1] = before[h] + steps[h] + (link_s[h] if h < p - 1 else 0.0)
    best_mean = [0.0] * p
    best = [(0.0, 1)] * p
    for i in range(p - 1):
        start = before[i]
        run_mean, run = -1.0, (0.0, 1)
        for j in range(p - 1, i, -1):
            total = before[j + 1] - start - (link_s[j] if j < p - 1 else 0.0)
            mean = total / (j - i + 1)
            if mean > run_mean:
                run_mean, run = mean, (total, j - i + 1)
            if run_mean > best_mean[j]:  # the best window from i ending at j or later
                best_mean[j], best[j] = run_mean, run
        if run_mean > best_mean[i]:
            best_mean[i], best[i] = run_mean, run
    return best


def _cycles_s(total: float, size: int, spread: float, pairs: int) -> float:
    """What ``pairs`` steady steps of a stage take when a cycle through a window of ``size``
    stages (``total``: their steps and links) paces them: the cycle spans ``(size - 1) spread
    + 1`` of the stage's micro-batches (``spread``: the stage's micro-batches per replica over
    the fewest any stage has, 1 with equal replica counts, as the engine's lookahead counts in
    the widest stage's micro-batches)."""
    return pairs * total / ((size - 1) * spread + 1)


def _warmups(counts: Sequence[int]) -> list[int]:
    """``w_k`` per stage: the engine's lookahead is (P - k - 1) micro-batches of the widest stage,
    and a stage warms up with at most all but one of its own."""
    p = len(counts)
    fewest = min(counts)
    w = [0] * p
    for k in range(p):
        n = counts[k]
        wk = int((p - k - 1) * n / fewest)
        w[k] = wk if wk < n - 1 else n - 1
    return w


def _ramps(steps: Sequence[float], fwds: Sequence[float], counts: Sequence[int], w: Sequence[int],
           link_s: Sequence[float], lam_in: Sequence[float], lam_out: Sequence[float],
           blocking: bool) -> tuple[list[float], list[float]]:
    """``G_k`` and ``C_k`` per stage, from the last stage back (``G_k`` needs ``G_{k+1}``).
    ``C_k`` is the slowest cool-down pace from k to the end per micro-batch of k: a stage with
    more replicas than k's backs each of k's micro-batches with a share of one of its steps."""
    p = len(steps)
    most = max(counts)
    g = [0.0] * p
    cool = [0.0] * p
    nxt_g = nxt_b = 0.0
    slowest = 0.0  # per micro-batch of the busiest replica anywhere
    for k in range(p - 1, -1, -1):
        f = fwds[k]
        b = steps[k] - f
        if blocking:
            own = f + lam_out[k] + w[k] * (f + lam_in[k] + lam_out[k])
            c = b + lam_in[k] + lam_out[k]
        else:
            own = f + w[k] * (f + lam_in[k])
            c = b + lam_out[k]
        if k < p - 1:
            trip = f + link_s[k] + nxt_g + nxt_b
            if trip > own:
                own = trip
        g[k] = nxt_g = own
        nxt_b = b
        c *= counts[k] / most
        if c > slowest:
            slowest = c
        cool[k] = slowest * most / counts[k]
    return g, cool


def _steady(stages: Sequence[StageTiming], steps: Sequence[float], fwds: Sequence[float], counts: Sequence[int],
            w: Sequence[int], link_s: Sequence[float], lam_in: Sequence[float], lam_out: Sequence[float],
            blocking: bool) -> list[float]:
    """``S_k`` per stage: its steady pairs after the first backward, paced by its own work and
    links, or by a cycle through its neighbours when that is longer (one loop, no call per
    stage: the planner evaluates this for every candidate plan)."""
    p = len(stages)
    windows = _windows(steps, link_s)
    fewest = min(counts)
    out = [0.0] * p
    for k in range(p):
        s = stages[k]
        t, f, wk = steps[k], fwds[k], w[k]
        b = t - f
        own = s.repeat_s - wk * t
        # the busiest replica's steady pairs (n_k - 1 - w_k with one replica)
        busy_pairs = (s.repeat_s / t if t > 0 else 0.0) - wk
        if busy_pairs < 0:
            busy_pairs = 0.0
        if blocking:  # both links, both ways, on every pair
            steady = (own if own > 0 else 0.0) + busy_pairs * 2 * (lam_in[k] + lam_out[k])
        else:  # an op waits for its own input's transfer only
            pace = f + lam_in[k]
            if b + lam_out[k] > pace:
                pace = b + lam_out[k]
            steady = own if own > busy_pairs * pace else busy_pairs * pace
        pairs = counts[k] - 1 - wk
        if pairs > 0:
            # the best window, and each neighbour pair (a cycle of its own, which the planner's
            # bounds count on): a cycle spans (size - 1) x spread + 1 of k's micro-batches
            spread = counts[k] / fewest
            total, size = windows[k]
            if size > 1:
                cycles = _cycles_s(total, size, spread, pairs)
                if cycles > steady:
                    steady = cycles
            if k > 0:
                cycles = pairs * (steps[k - 1] + link_s[k - 1] + t) / (spread + 1)
                if cycles > steady:
                    steady = cycles
            if k < p - 1:
                cycles = pairs * (t + link_s[k] + steps[k + 1]) / (spread + 1)
                if cycles > steady:
                    steady = cycles
        out[k] = steady
    return out


def _walk(stages: Sequence[StageTiming], link_s: Sequence[float], schedule: str) -> tuple[float, int]:
    """The largest stage candidate ``T_k = B_k + G_k + b_k + S_k + w_k C_k`` (module doc) and its
    stage."""
    p = len(stages)
    blocking = schedule == "blocking"
    steps = [s.step_s for s in stages]
    fwds = [s.fwd_s for s in stages]
    counts = [s.num_microbatches for s in stages]
    half = [l / 2 for l in link_s]
    lam_in = [0.0, *half]
    lam_out = [*half, 0.0]
    w = _warmups(counts)
    g, cool = _ramps(steps, fwds, counts, w, link_s, lam_in, lam_out, blocking)
    steady = _steady(stages, steps, fwds, counts, w, link_s, lam_in, lam_out, blocking)
    best, where = -1.0, 0
    before = 0.0  # B_k
    for k in range(p):
        t = steps[k]
        t_k = before + g[k] + (t - fwds[k]) + steady[k] + w[k] * cool[k]
        if t_k > best:
            best, where = t_k, k
        if k < p - 1:
            before += t + link_s[k]
    return best, where


def _longest_both(stages: Sequence[StageTiming], link_s: Sequence[float], link_counts: Sequence[int],
                  schedule: str = "prefetch", split: bool = True) -> tuple[float, int, bool, float]:
    """(the largest candidate time, its stage or link index, whether it is a link, the largest
    candidate time were every link instant: without ``split``, the first again)."""
    best, where = _walk(stages, link_s, schedule)
    at_link = False
    best0 = best
    if split and any(link_s):
        best0, _ = _walk(stages, [0.0] * len(link_s), schedule)
    base = 0.0
    for s in stages:
        base += s.step_s
    for l in link_s:
        base += l
    for i, (l, n) in enumerate(zip(link_s, link_counts)):
        t_link = base + (n - 1) * l / 2
        if t_link > best:
            best, where, at_link = t_link, i, True
    return best, where, at_link, best0


def one_f_one_b_time(
    stages: Sequence[StageTiming],
    link_s: Sequence[float],
    link_counts: Sequence[int],
    schedule: str = "prefetch",
    split: bool = True,
    drain_delay_s: float = 0.0,
) -> PipelineTime:
    """The 1F1B pipeline time of stage resources and per-micro-batch link times under a
    ``P2P_SCHEDULES`` semantics (see module doc).  Without ``split`` the time is not parted
    between bubble and p2p (the planner's fast path needs the total only): all but the
    compute is ``bubble``.  ``drain_delay_s``: what the last micro-batch's gradient loses on its
    way back to stage 0 when the stages' last sends share a NIC with their DP rings
    (``compose.drain_contention_s``); a transfer's cost, so it goes to ``p2p``."""
    total, k, at_link, without_links = _longest_both(stages, link_s, link_counts, schedule, split)
    total += drain_delay_s
    bottleneck = f"link {k}->{k + 1}" if at_link else f"stage {k}"
    busiest, compute = 0, stages[0].busy_s
    for i in range(1, len(stages)):
        if stages[i].busy_s > compute:
            busiest, compute = i, stages[i].busy_s
    return PipelineTime(
        compute_s=compute,
        bubble_s=max(0.0, without_links - compute),
        p2p_s=max(0.0, total - without_links),
        busiest_stage=busiest,
        bottleneck=bottleneck,
    )
