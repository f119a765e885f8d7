"""Every memo a search keeps, in one object (``SearchMemos``).

A search of part of a request (one GPU type alone, a pair of types, the other objective, the
request with a limit dropped) is a search of the same model over some of the same pools: it is
handed the memos it may share with the search that starts it (``SearchMemos.for_sub_search``),
as one object, rather than attribute by attribute.  Three scopes:

* **same model** (any sub-search: the same kinds and the same zones per GPU type): what depends
  on a shape and its pools alone, such as its split, placement and rent;
* **same availability** (the same GPU types, hence the same regime variants of each kind, see
  ``KindFigures.variants``): bound parts taken over those variants;
* **this search's own**: what depends on its objective, limits or top N, and small per-search
  figures.

Behind them, the **process's** memos (``process_memo``) live as long as the kinds of one model
(``kinds.shared_kind_cache``) for one network, for what planning calls one after the other can
share; each is emptied when full.  Every memo holds pure results: sharing one changes what is
recomputed, never an answer.  (Except where counting depends on it: a split or an evaluation
found in a memo is not counted again, so the scopes below are part of the search's behaviour.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROCESS_MEMO_SIZE = 1024  # entries per process memo (a replay's requests meet a few hundred lists)


def process_memo(kinds, network, name: str, max_entries: int = PROCESS_MEMO_SIZE, *, family: bool = False) -> dict:
    """A dict that lives as long as ``kinds`` (one model's, see ``kinds.shared_kind_cache``) for
    ``network``, for what planning calls one after the other can share; emptied when full.
    ``family``: shared by the kinds of every lever setting (``KindCache.family_extras``)."""
    key = ("process memo", name)
    extras = kinds.family_extras if family else kinds.extras
    hit = extras.get(key)
    if hit is None or hit[0] is not network:
        hit = extras[key] = (network, {})
    memo = hit[1]
    if len(memo) >= max_entries:
        memo.clear()
    return memo


@dataclass(slots=True, eq=False)
class ModelMemos:
    """Shared by a search and every sub-search (same model, kinds and zones per GPU type)."""

    # (recomputation, ZeRO stage) -> the KindCache of that lever setting (levers.lever_kinds): one
    # object for the whole search, whatever the process's shared dict drops meanwhile.
    lever_kinds: dict = field(default_factory=dict)
    # (micro-batch size, shapes.order_key) -> (placed stages, layer ends, busiest stage s) of the
    # order's min-max split, or None (no placement or no split fits); a hit is not a new split.
    prepared: dict = field(default_factory=dict)
    # shapes.order_key -> the order's placed stages [(kind, StagePlacement)], or None.
    placed: dict = field(default_factory=dict)
    # (micro-batch size, order_key) -> (USD per hour, egress USD per iteration lower bound) of the
    # placed order before its split (EgressParts.placed_costs_lb).
    placed_costs: dict = field(default_factory=dict)
    # (kind, its replicas per zone, the stage's place: lever_bounds._least_synced_params) -> the least
    # DP sync of such a stage without ZeRO (lever_bounds.least_sync_s); (kind, place) -> those parameters.
    least_syncs: dict = field(default_factory=dict)
    # ``pays`` rung (recomputation, ZeRO stage) -> indices of ``Searcher.split_orders`` its candidate
    # scan bounded past its limit with room to spare (levers._rung_candidates): no slower rung's can beat it.
    rung_scans: dict = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class TypeMemos:
    """Shared by a search and its sub-searches of the same availability (the same GPU types,
    so the same regime variants of every kind)."""

    variants: dict = field(default_factory=dict)  # (GPU, TP, mbs) -> [Kind] under every regime it may run in
    block_head: dict = field(default_factory=dict)  # (GPU, TP, mbs) -> (fastest block s, fastest last layer s)
    granular: dict = field(default_factory=dict)  # sorted (stages, block busy s, head busy s) -> bound s
    ring_rows: dict = field(default_factory=dict)  # (GPU, TP, DP) -> ring bound per depth 0..max_stages
    links: dict = field(default_factory=dict)  # (GPU a, TP a, GPU b, TP b, mbs) -> link s
    ring_usd: dict = field(default_factory=dict)  # (GPU, TP, DP, rule) -> rings' egress USD per gradient byte
    sync_curves: dict = field(default_factory=dict)  # (GPU, TP, DP, stages) -> ring s per block share
    routes: dict = field(default_factory=dict)  # (GPU, TP, DP, stages, rule) -> micro-batch route
    # (GPU, TP, mbs) -> whether every regime blocks on its sends; ("pairs", GPU, TP, mbs) -> links
    # between zones and per route; ("routes", GPU, TP, DP, stages, rule) -> each boundary's zone pairs
    blocked_links: dict = field(default_factory=dict)
    blocked_s: dict = field(default_factory=dict)  # (GPU, TP, mbs, DP, stages, rule, steps s) -> blocked bound s
    layer_refs: dict = field(default_factory=dict)  # mbs -> per layer, the fastest variant's time (spaces)


@dataclass(slots=True, eq=False)
class OwnMemos:
    """This search's alone (they depend on its objective, limits or top N, or are cheap)."""

    evaluated: dict = field(default_factory=dict)  # (mbs, FastStages) -> Evaluated; a hit is not a new evaluation
    boundary_bytes: dict = field(default_factory=dict)  # id(kind) -> smallest activation between stages
    round_trip: dict = field(default_factory=dict)  # (zone a, zone b) -> egress USD per byte both ways
    segments: dict = field(default_factory=dict)  # (GPU, mbs, micro-batches, reference) -> segment list
    crossing_usd: dict = field(default_factory=dict)  # (GPU, TP, mbs) -> USD per byte of a boundary across zones
    # mbs -> every shape of one or two types scored (SortedShapes), pruned by this search's top N
    # when scored: kept across its passes, dropped by Searcher.done_searching.
    scored: dict = field(default_factory=dict)
    relaxed: dict = field(default_factory=dict)  # (objective, caps kept, floor kept) -> (best plan, exhausted) (explain.relaxed)


@dataclass(slots=True, eq=False)
class ProcessMemos:
    """The process's (``process_memo``), fetched for each search: emptied there when full."""

    splits: dict  # (micro-batches, starting bound, ((kind, replicas) per stage)) -> (ends, busiest s)
    kind_figures: dict  # ("block and head" | "slowness", variants, ...) -> figures of regime variants
    # (GPU, pools, TP, DP, stages, rule, previous zone) -> placement of a segment (every lever setting's)
    segment_places: dict
    fewest_crossings: dict  # (GPU, pools, TP, DP, stages) -> the fewest zone crossings between whole stages
    segment_lists: dict  # (GPU, pools, spot, micro-batches, full range, stages cap, terms) -> [Segment]
    ordered_lists: dict  # (id(segment list), throughput) -> (list, the list with "unused" sorted, present)
    bound_parts: dict  # ((part, key, zones...), variants) -> links
    # (part, GPU, DP degree, [stages,] zones, stages cap, gradient bytes) -> ring rows and sync
    # curves: the network and those alone decide them, so every lever setting shares them
    rings: dict
    segment_columns: dict  # (id(segment list), context) -> (list, numpy columns of the list)
    small: dict  # ("gradient bytes" | "ideal GPU-seconds", ...) -> figures of the kinds alone
    # Never emptied: (stages, block busy s, head busy s) -> number; cached columns hold the numbers.
    granular_ids: dict
    granular_bounds: dict  # (number a << 32) + number b -> two-segment granular bound (emptied past 1 << 16)

    @classmethod
    def fetch(cls, kinds, network, num_blocks: int) -> ProcessMemos:
        return cls(
            splits=process_memo(kinds, network, "splits", max_entries=1 << 15),
            kind_figures=process_memo(kinds, network, "kind figures", max_entries=1 << 14),
            segment_places=process_memo(kinds, network, "segment placements", max_entries=1 << 15, family=True),
            fewest_crossings=process_memo(kinds, network, "fewest crossings", max_entries=1 << 15, family=True),
            segment_lists=process_memo(kinds, network, "segment lists"),
            ordered_lists=process_memo(kinds, network, "ordered segment lists"),
            bound_parts=process_memo(kinds, network, "bound parts", max_entries=1 << 15),
            rings=process_memo(kinds, network, "rings", max_entries=1 << 15, family=True),
            segment_columns=process_memo(kinds, network, "segment columns"),
            small=process_memo(kinds, network, "figures of the kinds"),
            granular_ids=kinds.extras.setdefault("granular ids", {}),
            granular_bounds=kinds.extras.setdefault(("granular bounds", num_blocks), {}),
        )


@dataclass(slots=True, eq=False)
class SearchMemos:
    """Every memo one search keeps (see the module docstring for the scopes)."""

    model: ModelMemos
    types: TypeMemos
    own: OwnMemos
    process: ProcessMemos

    @classmethod
    def new(cls, kinds, network, num_blocks: int) -> SearchMemos:
        return cls(model=ModelMemos(), types=TypeMemos(), own=OwnMemos(),
                   process=ProcessMemos.fetch(kinds, network, num_blocks))

    def for_sub_search(self, kinds, network, num_blocks: int, *, same_availability: bool) -> SearchMemos:
        """The memos of a sub-search: this search's model memos, its type memos too when the
        sub-search has the same availability, its own fresh."""
        return SearchMemos(model=self.model, types=self.types if same_availability else TypeMemos(),
                           own=OwnMemos(), process=ProcessMemos.fetch(kinds, network, num_blocks))
