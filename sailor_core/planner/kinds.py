"""Replica kinds: one (GPU type, TP degree) at one micro-batch size, with O(1) stage sums.

Everything here reads the simulator's own tables (``simulator.tables.layer_table``)
and memory model (``simulator.memory``: ``stage_peak_bytes`` is ``stage_memory``'s peak),
so a stage the planner thinks fits is one ``simulate`` agrees fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sailor_core.catalog.gpus import get_gpu
from sailor_core.catalog.models import get_model, tp_split_problem
from sailor_core.errors import ProfileError
from sailor_core.profiles.types import ModelProfile
from sailor_core.regimes import TrainingRegime, get_regime
from sailor_core.plan.types import RECOMPUTE_FULL, RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from sailor_core.simulator.levers import recomputed_profile
from sailor_core.simulator.memory import profile_head_logits, stage_peak_bytes
from sailor_core.simulator.tables import LayerTable, layer_table


@dataclass(slots=True, eq=False)
class Kind:
    """A replica kind.  ``comp_cum[i]`` is forward + backward of one micro-batch over layers [0, i)."""

    gpu: str
    tp_degree: int
    micro_batch_size: int
    profile: ModelProfile
    regime: TrainingRegime
    capacity_bytes: int
    comp_cum: list[float]
    num_layers: int
    max_end_memo: dict[tuple, int] = field(default_factory=dict)  # max_end by (start, K[, DP]), read in split's hot loop
    recompute: str = RECOMPUTE_NONE  # the memory levers of the stages it runs (simulator/levers.py):
    zero_stage: int = 0  # its profile recomputes; ZeRO applies where a stage has replicas to shard over
    _table: LayerTable | None = None  # the profile's, set with _head_logits on first use
    _head_logits: int = -1  # logits of one micro-batch on its LM head (memory.profile_head_logits)

    def time_s(self, start: int, end: int) -> float:
        return self.comp_cum[end] - self.comp_cum[start]

    @property
    def total_params(self) -> int:
        """Parameters one GPU of this kind holds for the whole model (its TP shard)."""
        return layer_table(self.profile).params_cum[-1]

    @property
    def model_time_s(self) -> float:
        return self.comp_cum[-1]

    def fits(self, start: int, end: int, num_inflight: int, dp_degree: int = 1) -> bool:
        return self.peak_bytes(start, end, num_inflight, dp_degree=dp_degree) <= self.capacity_bytes

    def peak_bytes(self, start: int, end: int, num_inflight: int, regime: TrainingRegime | None = None,
                   num_microbatches: int = 0, dp_degree: int = 1) -> int:
        """``stage_memory(...).peak_bytes`` of one GPU holding layers [start, end) with K in flight,
        under ``regime`` (default: the kind's), its replica running ``num_microbatches`` (0: more
        than K) in a stage of ``dp_degree`` replicas (ZeRO's shards), without building the breakdown."""
        if self._head_logits < 0:
            self._table = layer_table(self.profile)
            self._head_logits = profile_head_logits(self.profile)
        return stage_peak_bytes(self._table, start, end, num_inflight, regime or self.regime, self._head_logits,
                                num_microbatches, dp_degree, self.zero_stage)

    def max_end_key(self, start: int, num_inflight: int, dp_degree: int) -> tuple:
        """``max_end_memo``'s key: the DP degree counts only where ZeRO shards by it."""
        return (start, num_inflight) if not self.zero_stage else (start, num_inflight, dp_degree)

    def max_end(self, start: int, num_inflight: int, dp_degree: int = 1) -> int:
        """Largest ``end`` such that layers [start, end) fit with K in flight; ``start`` if none does.

        Memory grows with every added layer, so the fitting ends form a prefix: binary search.
        It grows with K too, so the answers for K + j and K - j already found bound this one
        (narrowing the search, never changing its answer).
        """
        memo = self.max_end_memo
        key = self.max_end_key(start, num_inflight, dp_degree)
        found = memo.get(key)
        if found is not None:
            return found
        peak, capacity = self.peak_bytes, self.capacity_bytes
        lo, hi = start, self.num_layers  # invariant: lo fits (or is start), answer in [lo, hi]
        for j in (1, 2, 3):
            more = memo.get(self.max_end_key(start, num_inflight + j, dp_degree))
            if more is not None:
                lo = more
                break
        for j in (1, 2, 3):
            fewer = memo.get(self.max_end_key(start, num_inflight - j, dp_degree)) if num_inflight > j else None
            if fewer is not None:
                hi = fewer
                break
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if peak(start, mid, num_inflight, dp_degree=dp_degree) <= capacity:
                lo = mid
            else:
                hi = mid - 1
        memo[key] = lo
        return lo


_SHARED: dict[tuple, KindCache] = {}

# The memory levers a search may add, cheapest first (``planner/levers.py``): ZeRO-1 (its time is
# nearly free), selective recomputation, ZeRO-2, full recomputation.  ZeRO needs a stage with
# replicas; a stage of one replica gets the recomputation of its rung alone.
LEVER_LADDER: tuple[tuple[str, int], ...] = (
    (RECOMPUTE_NONE, 1), (RECOMPUTE_SELECTIVE, 1), (RECOMPUTE_SELECTIVE, 2), (RECOMPUTE_FULL, 2))


def shared_kind_cache(model: str, seq_len: int | None, regime: str | None, profiles,
                      levers: tuple[str, int] = (RECOMPUTE_NONE, 0)) -> KindCache:
    """The process's KindCache for these arguments: planning calls that follow each other (a
    replay, a job re-planning after preemptions) meet the same kinds, with their memory
    limits and the simulator's stage figures memoised on them.  A profile source with a
    ``version`` (ProfileDB counts its changes) is shared until it changes; one without gets
    a cache of its own.  ``levers``: (recomputation, ZeRO stage) of every kind it builds."""
    version = getattr(profiles, "version", None)
    if version is None:
        return KindCache(model, seq_len, regime, profiles, levers)
    key = (model, seq_len, regime, id(profiles), version)
    if levers != (RECOMPUTE_NONE, 0):
        key += (levers,)
    hit = _SHARED.get(key)
    if hit is None or hit.profiles is not profiles:
        plain = None if levers == (RECOMPUTE_NONE, 0) else shared_kind_cache(model, seq_len, regime, profiles)
        if len(_SHARED) >= 8 + 2 * len(LEVER_LADDER):
            _SHARED.clear()
        hit = _SHARED[key] = KindCache(model, seq_len, regime, profiles, levers)
        if plain is not None:
            hit.family_extras = plain.extras
    return hit


def valid_tp_degrees(model: str, gpu: str, max_tp_degree: int) -> list[int]:
    """TP degrees a replica may use: powers of two inside one node that the engine can split the
    model over (``catalog.models.tp_split_problem``: heads, KV heads, FFN, vocabulary)."""
    spec = get_model(model)
    node = get_gpu(gpu).max_gpus_per_node
    return [d for d in (1, 2, 4, 8, 16) if d <= min(node, max_tp_degree) and tp_split_problem(spec, d) is None]


class KindCache:
    """Builds and memoises kinds from a profile source."""

    def __init__(self, model: str, seq_len: int | None, regime: str | None, profiles,
                 levers: tuple[str, int] = (RECOMPUTE_NONE, 0)) -> None:
        self.model = model
        self.levers = levers
        self.seq_len = seq_len
        self.regime_name = regime
        self.profiles = profiles
        self._kinds: dict[tuple[str, int, int], Kind | None] = {}
        self._errors: dict[tuple, str] = {}
        self.extras: dict = {}  # what lives as long as these kinds (see planner.search.memo)
        # what lives as long as the kinds of every lever setting of this model and profile source
        # (the levers' caches take the plain one's): figures the levers leave unchanged
        self.family_extras: dict = self.extras

    def errors_for(self, gpus) -> list[str]:
        """Why kinds of these GPU types could not be built (one message per missing profile)."""
        wanted = set(gpus)
        return [msg for key, msg in self._errors.items() if key[0] in wanted]

    def get(self, gpu: str, tp_degree: int, micro_batch_size: int, regime: str | None = None) -> Kind | None:
        """The kind under ``regime`` (default: the request's, else the profile's own).

        ``simulate`` runs a whole plan under one regime, the plan's or else its first replica's
        profile's, and takes every other replica's profile under it: ``in_regime_of`` does that.
        """
        regime = regime or self.regime_name
        key = (gpu, tp_degree, micro_batch_size, regime)
        if key in self._kinds:
            return self._kinds[key]
        try:
            prof = self.profiles.get(self.model, gpu, tp_degree, micro_batch_size, self.seq_len,
                                     regime=regime)
        except ProfileError as exc:
            self._errors[key] = str(exc)
            self._kinds[key] = None
            return None
        prof = recomputed_profile(prof, self.levers[0])
        table = layer_table(prof)
        comp = [f + b for f, b in zip(table.fwd_cum, table.bwd_cum)]
        kind = Kind(
            gpu=gpu,
            tp_degree=tp_degree,
            micro_batch_size=micro_batch_size,
            profile=prof,
            regime=get_regime(regime or prof.regime),
            capacity_bytes=get_gpu(gpu).memory_bytes,
            comp_cum=comp,
            num_layers=table.num_layers,
            recompute=self.levers[0],
            zero_stage=self.levers[1],
        )
        self._kinds[key] = kind
        return kind

    def in_regime_of(self, kind: Kind, first: Kind) -> Kind:
        """``kind`` as ``simulate`` sees it in a plan whose first replica is of kind ``first``:
        replicas of the first's (GPU, TP) share its profile; every other profile is taken under
        the plan's regime (the request's, else the first profile's)."""
        if (kind.gpu, kind.tp_degree) == (first.gpu, first.tp_degree):
            return first
        other = self.get(kind.gpu, kind.tp_degree, kind.micro_batch_size,
                         self.regime_name or first.profile.regime)
        return other if other is not None else kind
