"""Uneven splits, more zones and more egress only where they truly win: among the plans the
search found within ``SIMPLER_WITHIN`` of the best (by the request's ranking), the simplest is
returned first, and the answer says so (``explain.why_simpler``).

Simplest means, in this order: an even layer split (``baseline.equal_split``'s stage sizes),
fewer zones, less egress per iteration; then the better score.  The even-split version of the
best plan is evaluated here too (the search itself only splits by min-max), so a plan whose
uneven split gains less than the tolerance gives way to its even twin.
"""

from __future__ import annotations

from sailor_core.planner.baseline import equal_split
from sailor_core.planner.fastsim import FastStage
from sailor_core.planner.search import Evaluated, Searcher
from sailor_core.simulator.compose import SECONDS_PER_HOUR

# Two plans whose simulated figures differ by less than this are treated as equal.  The
# simulator's error against measured runs is larger (6 % median on held-out iteration times),
# but most of it is shared by two plans on the same GPUs and links (the same layer profiles
# and network fits); 2 % is what a difference in the plans' own structure (a layer moved, a
# ring across one more zone) must exceed to be believed.
SIMPLER_WITHIN = 0.02
EGRESS_DIGITS = 9  # egress compared to a nano-dollar per iteration


def simplicity(ev: Evaluated, num_layers: int) -> tuple[bool, int, float]:
    """(uneven split, zones used, egress USD per iteration): smaller is simpler."""
    sizes = sorted(s.layer_end - s.layer_start for s in ev.stages)
    even = sorted(b - a for a, b in zip([0, *equal_split(num_layers, len(ev.stages))], equal_split(num_layers, len(ev.stages))))
    zones = {z for s in ev.stages for _, z, _ in s.groups}
    res = ev.res
    egress = max(0.0, res.usd_per_iteration - res.usd_per_hour * res.iteration_time_s / SECONDS_PER_HOUR)
    # (rent subtracted from the total leaves rounding dust where there is no egress)
    return sizes != even, len(zones), round(egress, EGRESS_DIGITS)


def even_twin(searcher: Searcher, ev: Evaluated) -> Evaluated | None:
    """``ev`` with its stages' layers split evenly, or None if it already is."""
    ends = equal_split(searcher.num_layers, len(ev.stages))
    if [s.layer_end for s in ev.stages] == ends:
        return None
    starts = [0, *ends[:-1]]
    stages = tuple(FastStage(a, b, s.groups) for a, b, s in zip(starts, ends, ev.stages))
    return searcher.evaluate(ev.mbs, stages)


def prefer_simpler(searcher: Searcher) -> tuple[Evaluated, Evaluated] | None:
    """Put the simplest plan within ``SIMPLER_WITHIN`` of the best first in ``searcher.top``:
    (the plan chosen, the best it was preferred to), or None when the best is the simplest."""
    top = [e for e in searcher.top if e.feasible]
    if not top:
        return None
    best = top[0]
    twin = even_twin(searcher, best)
    if twin is not None:
        searcher.offer(twin)
        top = [e for e in searcher.top if e.feasible]
    limit = abs(best.score) * SIMPLER_WITHIN
    near = [e for e in top if e.res.fits and e.score - best.score <= limit]
    L = searcher.num_layers
    choice = min(near, key=lambda e: (simplicity(e, L), e.score))
    if choice is best or simplicity(choice, L) == simplicity(best, L):
        return None
    searcher.top.remove(choice)
    searcher.top.insert(0, choice)
    return choice, best
