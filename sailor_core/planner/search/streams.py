"""Shapes in order of their bound: ``ProductHeap`` walks the product of per-type segment lists
(three GPU types or more) in order of an additive key; ``SortedShapes`` hands out the shapes of
one or two types that ``scored`` scored, best first, grown on demand by a ``ShapeStream``."""

from __future__ import annotations

import bisect
import heapq
import math

from sailor_core.planner.search.shapes import Segment

CHUNK = 2048  # shapes refined at once (numpy temporaries of a few lines x this stay in cache)
FIRST_CHUNK = 256  # shapes a stream refines first (then doubling to CHUNK)


class ProductHeap:
    """Index tuples over per-type lists in nondecreasing order of an additive key."""

    def __init__(self, keys: list[list[float]]) -> None:
        self.keys = keys
        self.heap: list[tuple[float, tuple[int, ...]]] = []
        self.seen: set[tuple[int, ...]] = set()
        if all(keys):
            start = tuple(0 for _ in keys)
            self._push(start)

    def _push(self, idx: tuple[int, ...]) -> None:
        if idx in self.seen:
            return
        self.seen.add(idx)
        heapq.heappush(self.heap, (sum(k[i] for k, i in zip(self.keys, idx)), idx))

    def peek(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def pop(self) -> tuple[int, ...]:
        _, idx = heapq.heappop(self.heap)
        for j in range(len(idx)):
            if idx[j] + 1 < len(self.keys[j]):
                self._push(idx[:j] + (idx[j] + 1,) + idx[j + 1:])
        return idx


class SortedShapes:
    """Shapes of at most two per-type lists (index -1 or past the end: type unused), best first,
    with their bound's parts: a bound on the busiest stage, and ``tight``'s (iteration time,
    USD per hour, egress USD per iteration, stages).  With a ``stream`` (``ShapeStream``) the
    lists are grown on demand, in the same order a full sort would give."""

    def __init__(self, first: list[Segment], second: list[Segment], ia, ib, scores, busiest, parts) -> None:
        self.first, self.second = first, second
        self.ia, self.ib, self.scores = ia.tolist(), ib.tolist(), scores.tolist()
        self.busiest = busiest.tolist()
        self.parts = [x.tolist() for x in parts]  # per part, a list over the shapes
        self.pos = 0
        self.cut = math.inf  # shapes not below it are left out (with ``lazy``: a lower bound of that cut)
        self.stream: ShapeStream | None = None
        self.lazy, self.lazy_limit = None, math.inf  # a ``cut.LazyCut``, and the limit it is capped by

    def _have(self, count: int) -> bool:
        """Whether there are at least ``count`` shapes (growing the lists if need be)."""
        have = count <= len(self.scores) or (self.stream is not None and self.stream.grow(count))
        return have and (self.lazy is None or self.cut_above(self.scores[count - 1]))

    def exact_cut(self) -> float:
        return self.cut if self.lazy is None else min(self.lazy_limit, self.lazy.exact())

    def cut_above(self, score: float) -> bool:
        """Whether the cut is above ``score`` (with ``lazy``, settled only if need be)."""
        return score < self.cut or score < self.exact_cut()

    def peek(self) -> float:
        """The best bound left (those cut off included)."""
        return self.scores[self.pos] if self._have(self.pos + 1) else self.exact_cut()

    def fresh(self) -> SortedShapes:
        """A copy to walk from the start (the lists are shared, only ever appended to)."""
        out = SortedShapes.__new__(SortedShapes)
        out.first, out.second, out.ia, out.ib, out.scores = self.first, self.second, self.ia, self.ib, self.scores
        out.busiest, out.parts, out.stream = self.busiest, self.parts, self.stream
        out.pos, out.cut, out.lazy, out.lazy_limit = 0, self.cut, self.lazy, self.lazy_limit
        return out

    def has_next(self) -> bool:
        return self._have(self.pos + 1)

    def count_below(self, score: float) -> int:
        if not (self.cut >= score or self.exact_cut() >= score):
            return 1 << 30  # some were cut off: no proof
        if self.stream is not None:
            self.stream.grow_below(score)
        return bisect.bisect_left(self.scores, score, lo=self.pos) - self.pos

    def peek_stages(self) -> int:
        self._have(self.pos + 1)
        a, b = self.ia[self.pos], self.ib[self.pos]
        return ((self.first[a].num_stages if a < len(self.first) else 0)
                + (self.second[b].num_stages if b < len(self.second) else 0))

    def pop(self) -> tuple[tuple[Segment, ...], tuple]:
        """The next shape and its bound as ``tight`` gives it: (score, busiest stage, parts)."""
        self._have(self.pos + 1)
        i = self.pos
        a, b = self.ia[i], self.ib[i]
        self.pos += 1
        shape = tuple(seg for seg in (self.first[a] if a < len(self.first) else None,
                                      self.second[b] if b < len(self.second) else None) if seg is not None)
        return shape, (self.scores[i], self.busiest[i], tuple(x[i] for x in self.parts))


class ShapeStream:
    """Grows a ``SortedShapes`` in exactly the order sorting every refined shape would give
    (final bound, then scoring order), refining shapes only as far as the walk gets.

    Refining only raises a bound, and the shapes to refine come in order of their first bound,
    so a refined shape whose final bound is below the next unrefined one's first bound can be
    placed: no shape still to refine can come before it, ties included (strictly below).  The
    shapes never refined (past the best 20000) keep their first bound, at least every refined
    shape's first bound: they join once all are refined.  A search walks a few hundred of
    some 15000 shapes: the refinement (a fifth of a two-type search) mostly goes."""

    __slots__ = ("scored", "lists", "pool_idx", "pool_score", "never_added", "chunk")

    def __init__(self, scored, target: SortedShapes) -> None:
        """``scored``: a ``scored.ScoredShapes``, whose ``final_of(indices)`` refines shapes and
        gives (those within the limits, their final bounds), ``never_kept()`` the same for the
        shapes never refined, and ``rows(indices)`` their (ia, ib, busiest, parts) arrays."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        self.scored = scored
        # The lists it grows (not the SortedShapes itself, which holds the stream: no cycle).
        self.lists = (target.ia, target.ib, target.scores, target.busiest, *target.parts)
        self.pool_idx = np.empty(0, dtype=np.int64)  # final, not placed yet, sorted by (bound, index)
        self.pool_score = np.empty(0)
        self.never_added = False
        # Shapes refined at once, doubling to CHUNK (few are needed at first; fewer where the
        # refinement also places lone segments and their rings, ``ScoredShapes.defer``).
        self.chunk = 64 if scored.defer else FIRST_CHUNK

    def _next_unplaced_lb(self) -> float:
        """A bound on every shape not in the pool or placed yet (inf: none)."""
        s = self.scored
        if s.num_refined < len(s.first):
            return s.next_pre()
        return math.inf

    def _step(self) -> bool:
        """Place what can be placed, else refine (or take in) more; False when all is placed."""
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        lb = self._next_unplaced_lb()
        if lb == math.inf and not self.never_added:
            self._merge(*self.scored.never_kept())
            self.never_added = True
        take = int(np.searchsorted(self.pool_score, lb, side="left"))
        s = self.scored
        if take:
            idx, score = self.pool_idx[:take], self.pool_score[:take]
            self.pool_idx, self.pool_score = self.pool_idx[take:], self.pool_score[take:]
            ia, ib, busiest, parts = s.rows(idx)
            for mine, more in zip(self.lists, (ia, ib, score, busiest, *parts)):
                mine.extend(more.tolist())
            return True
        if s.num_refined >= len(s.first):
            return False
        sel = s.first[s.num_refined:s.num_refined + self.chunk]
        s.num_refined += len(sel)
        # (only the alone bound deferred, the widening pass: its walks stop within ~100 shapes of
        # a space, so it refines 64 at a time up to 256, then doubles as the others do)
        if s.defer != ("alone",) or s.num_refined >= 4 * self.chunk:
            self.chunk = min(2 * self.chunk, CHUNK)
        self._merge(*s.final_of(sel))
        return True

    def _merge(self, idx, score) -> None:
        # lazy: numpy loads when a search runs, not when the CLI checks a request
        import numpy as np

        if not len(idx):
            return
        all_idx = np.concatenate([self.pool_idx, idx])
        all_score = np.concatenate([self.pool_score, score])
        order = np.lexsort((all_idx, all_score))
        self.pool_idx, self.pool_score = all_idx[order], all_score[order]

    def refine_all(self) -> None:
        """Refine every shape left at once (the same figures as in chunks), into the pool."""
        s = self.scored
        if s.num_refined < len(s.first):
            sel = s.first[s.num_refined:]
            s.num_refined = len(s.first)
            self._merge(*s.final_of(sel))

    def grow(self, count: int) -> bool:
        scores = self.lists[2]
        while len(scores) < count:
            if not self._step():
                return False
        return True

    def grow_below(self, score: float) -> None:
        """Place every shape whose bound is below ``score``."""
        scores = self.lists[2]
        while not (scores and scores[-1] >= score) and self._step():
            pass
