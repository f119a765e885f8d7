"""State handed over in memory (runtime/handover.py): across plan changes of PP, TP and DP with mixed
GPU types, ranks that take their state from the ranks holding it end bit for bit where a reload of
the checkpoint puts them; a rank some of whose state nobody holds reads the checkpoint."""

from __future__ import annotations

from pathlib import Path

from sailor_core.runtime.handover import Need, Offer, plan_schedule

from .handover_ranks import GENERATIONS
from .rank_scripts import run_rank_scripts

FULL = ("params", "exp_avg", "exp_avg_sq")


def test_handed_over_state_is_the_checkpoint_reloaded_across_plans(corpus, tmp_path: Path):
    num = 1 + max(p for _, procs, _, _ in GENERATIONS for p in procs)
    got = {(r["generation"], r["rank"]): r for out in run_rank_scripts("handover_ranks.py", num, corpus, tmp_path)
           for r in out}
    want = {(g, rank): source for g, (_, _, _, expected) in enumerate(GENERATIONS) for rank, source in expected.items()}
    assert {k: r["state_from"] for k, r in got.items()} == want
    assert {k: r["differences"] for k, r in got.items() if r["differences"]} == {}


def _offer(layer: int, name: str, degree: int, tp_rank: int, shape, fields=FULL) -> Offer:
    return Offer(layer=layer, name=name, tp_degree=degree, tp_rank=tp_rank, shape=tuple(shape), dtype="float32",
                 fields=fields)


def test_the_schedule_prefers_what_a_rank_holds_and_needs_whole_tp_sets():
    tok = Need(layer=0, name="tok", full_shape=(10, 4), shard_dim=0)
    norm = Need(layer=0, name="norm", full_shape=(4,), shard_dim=None)
    offers = [[_offer(0, "tok", 2, 0, (5, 4)), _offer(0, "norm", 2, 0, (4,))],   # rank 0: TP rank 0 of 2
              [_offer(0, "tok", 2, 1, (5, 4)), _offer(0, "norm", 2, 1, (4,))],   # rank 1: TP rank 1 of 2
              [_offer(0, "tok", 1, 0, (10, 4)), _offer(0, "norm", 1, 0, (4,))],  # rank 2: all of it
              []]
    s = plan_schedule(offers, [[], [tok, norm], [], [tok, norm]])
    # rank 1 takes rank 2's whole tensors (one send each) rather than rank 0's half of the matrix
    # (as many sends, more parts) or rank 0's copy of the replicated norm (as many, a higher degree)
    assert [(src, tp) for _, _, parts in s.sources[1] for tp, src, _ in parts] == [(2, 0), (2, 0)]
    assert {(t.src, t.dst, t.offer.name, t.field) for t in s.transfers if t.dst == 1} == \
        {(2, 1, n, f) for n in ("tok", "norm") for f in FULL}
    assert 0 not in s.sources and 2 not in s.sources  # they need nothing

    # TP rank 1 of 2 alone is not the matrix: rank 3 reads the checkpoint; the replicated norm alone would do
    partial = [[], [_offer(0, "tok", 2, 1, (5, 4)), _offer(0, "norm", 2, 0, (4,))], [], []]
    assert 3 not in plan_schedule(partial, [[], [], [], [tok, norm]]).sources
    assert 3 in plan_schedule(partial, [[], [], [], [norm]]).sources
    # a holder without AdamW state and one with do not make a set; shapes of another model neither
    mixed = [[_offer(0, "tok", 2, 0, (5, 4), FULL[:1])], [_offer(0, "tok", 2, 1, (5, 4))], [], []]
    assert plan_schedule(mixed, [[], [], [tok], []]).sources == {}
    other = [[_offer(0, "tok", 1, 0, (12, 4))], [], [], []]
    assert plan_schedule(other, [[], [], [tok], []]).sources == {}
