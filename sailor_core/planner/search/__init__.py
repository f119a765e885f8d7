"""Best-first search over pipeline shapes, uneven layer splits and placements.

Search space (per micro-batch size):

* a *segment* is a run of consecutive stages on one GPU type: its TP degree,
  data-parallel degree, number of stages and zone placement rule;
* a *shape* is at most one segment per GPU type, in an order (larger-memory GPUs
  first, where 1F1B keeps more micro-batches in flight, and the reverse);
* each shape's layers are split unevenly (``split.min_max_split``) to balance
  the segments' different speeds and memory, then polished by moving stage
  boundaries one layer at a time while ``simulate`` says the objective improves;
* optionally (``mixed_stages``) leftover GPUs of any type join a stage as extra
  replicas when they are not slower than its straggler and the objective improves
  (``planner/mixing.py``), and on small pools the whole space of mixed stages is walked
  with a bound (``planner/mixed_space.py``).

Every candidate is scored by ``simulate`` itself, so the ranking, the caps and
the floor are checked against the same figures ``sailor simulate`` prints.

Bounds, refined in steps so that only shapes still in front pay for the next:

0. capacity: the segments' compute capacity with fractional layers (an upper bound
   on throughput, or a lower bound on cost), plus the smallest DP ring, the links'
   steady state (``steady_links_s``), the pipeline's warm-up and cool-down
   (``pipe_work_rate``, ``warm_up_with_links_s``), compute, links and DP sync
   together for two segments (``joint_lb``, and in numpy ``pipeline_lines`` with the
   stages where the segments meet: moving work off one segment shortens its ring but
   lengthens the other's compute), and the rings and stage boundaries that must cross
   zones (egress, with rent and time together: ``joint_cost_lb``);
1. granular: whole blocks per stage and the LM head on one of them
   (``granular_busiest_s``), and, when cost matters, the placement's exact rent
   and the egress of every micro-batch crossing a zone between stages;
2. split: the real min-max split of each order (memory, real layer times) and its
   exact rent and egress; each order is queued on its own.

All three are valid bounds, so pruning (a bound that cannot enter the top N) is
safe.  The queue, though, is ordered by an *estimate*: the bound with its
iteration time scaled by the typical excess of simulated over bounded time seen
so far on pipelines as deep (deep pipelines lose more to p2p and bubbles than a
bound can see).  That finds the good plans early; once many evaluations in a row
do not improve the best plan (``patience``) the search switches to bound order, which either
proves the top N optimal (``exhausted``, as on small clusters) or stops after
twice the patience.

The package, one part at a time (each module's docstring says more):

* ``shapes``: segments, shape orders, building a GPU type's segment list and placing a shape;
* ``memo``: every memo a search keeps (``SearchMemos``), by scope: shared with every
  sub-search, with those of the same availability, the search's own, and the process's;
* ``bounds``: the lower bounds as pure functions (each tested alone in
  ``tests/planner/test_bounds.py``);
* ``figures``, ``parts``, ``egress``: what the bounds take from the kinds, and the time and
  egress bounds of segments and placed shapes, memoised for one search;
* ``shape_bound``: a shape's bound as the queue takes it (``tight``), and the queue's estimate;
* ``streams``, ``scored``: shapes in order of their bound (the lazy product over per-type lists;
  every shape of one or two types scored with numpy and refined on demand);
* ``spaces``: the shapes of one micro-batch size;
* ``searcher``: one planning run (``Searcher``): evaluate, offer, thresholds, limits, splits,
  polish;
* ``loop``: the best-first loop (``run_search``).
"""

from sailor_core.planner.search.loop import proof_in_reach, proof_possible, run_search
from sailor_core.planner.search.searcher import Evaluated, Searcher, SearchStats, better
from sailor_core.planner.search.shapes import Segment, orders

__all__ = ["Evaluated", "SearchStats", "Searcher", "Segment", "better", "orders", "proof_in_reach", "proof_possible", "run_search"]
