"""The band's cut under a cap, a floor or the cost objective (``spaces.attach_sorted``): the
(keep + 1)-th best final bound over the shapes of every micro-batch size, past which shapes are
not queued and stay in the proof as that bound.  ``settle_cut`` finds it before the walk (two
GPU types, whose walk reaches it: see docs/benchmarks/planner.md, floorcut); ``LazyCut`` only
when the walk or a proof gets to a lower bound of it (one type, whose walk stops far below)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sailor_core.planner.search.streams import CHUNK, SortedShapes

if TYPE_CHECKING:
    from sailor_core.planner.search.scored import ScoredShapes


def settle_cut(scored: list[ScoredShapes], keep: int, chunk: int = CHUNK) -> float:
    """The (keep + 1)-th best final bound over every shape of ``scored`` (inf if there are no
    more than ``keep``), refining shapes only as far as that needs: best first bound first, those
    below the (keep + 1)-th best final bound known (it only falls), until the next first bound is
    no better.  Refining only raises a bound, so the shapes left unrefined cannot come below it
    (and the shapes below it are exactly those a full refinement would put there)."""
    # lazy: numpy loads when a search runs, not when the CLI checks a request
    import numpy as np

    while True:
        pool = np.concatenate([s.never_refined[:keep + 1] for s in scored]
                              + [x for s in scored for x in s.final] or [np.empty(0)])
        cut = float(np.partition(pool, keep)[keep]) if len(pool) > keep else math.inf
        nxt = min(scored, key=lambda s: s.next_pre(), default=None)
        if nxt is None or nxt.next_pre() >= cut:
            return cut
        # A shape whose granular bound is not below the cut known stays at least that cut with
        # or without its joint bounds: the (keep + 1)-th best, now and after, is the same.  Nor is
        # one whose first bound is not below it needed (the floor row: 23,100 -> 19,000 refined).
        ahead = nxt.pre[nxt.first[nxt.num_refined:nxt.num_refined + chunk]]
        nxt.refine_next(int(np.searchsorted(ahead, cut, side="left")), below=cut)


class LazyCut:
    """``settle_cut``'s figure for one-type spaces scored with ``defer``, streamed: ``lower`` is
    the (keep + 1)-th best first bound (refining only raises bounds, and every shape kept is
    among those scored, so the cut is at least that); ``exact`` refines every shape left (each
    stream takes them in) and takes the (keep + 1)-th best final bound, as ``settle_cut``."""

    __slots__ = ("keep", "lower", "value", "streams")

    def __init__(self, scored: list[ScoredShapes], keep: int) -> None:
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        pre = np.concatenate([s.pre for s in scored] or [np.empty(0)])
        self.keep = keep
        self.lower = float(np.partition(pre, keep)[keep]) if len(pre) > keep else math.inf
        self.value: float | None = None if self.lower < math.inf else math.inf
        self.streams: list = []

    def sorted(self, scored: ScoredShapes) -> SortedShapes:
        """``scored``'s shapes streamed, each one's walk and proof bounded by this cut."""
        out = scored.streamed()
        out.lazy, out.lazy_limit = self, out.cut
        out.cut = min(out.cut, self.lower)
        self.streams.append(out.stream)
        return out

    def exact(self) -> float:
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        if self.value is None:
            for stream in self.streams:
                stream.refine_all()
            pool = np.concatenate([np.asarray(st.lists[2], dtype=float) for st in self.streams]
                                  + [st.pool_score for st in self.streams])
            self.value = float(np.partition(pool, self.keep)[self.keep]) if len(pool) > self.keep else math.inf
        return self.value
