"""How long a new plan's ranks take to get the training state: from the ranks that hold it, over
the job's network (``runtime/handover.py``), or from the checkpoint in object storage.

The one model of that load for the controller's cost of a change (``economics.change_s`` and the
cost of a hit) and for the replay (``replay/costs.ChangeCosts``), so both weigh the same seconds;
and the one home of a job's whole checkpoint (``checkpoint_bytes_for``) and of the storage's default
bandwidth, which the flow's costs (``economics.job_costs``) and the check before renting
(``job/prerent.check_reach``) read too.

What the runtime does (``runtime/handover.py``): a rank whose own shard (same layers, same TP
degree, no ZeRO) survives adopts it and receives nothing; any other rank receives its layers' TP
shard (weights and AdamW moments) point-to-point from a surviving holder, over the job's network
(a survivor is a rank of the old plan on an instance the new one keeps: instances released with
the change take their state with them);
layers no survivor holds (every replica of their stage preempted), and stages under ZeRO (whose
holders keep no AdamW state), come from the checkpoint in storage.  Ranks receive in parallel, as
storage is read in parallel: the load is the slowest receiver's transfer, or the bytes storage
must serve at its aggregate bandwidth, whichever is longer.

The replay knows how many GPUs each pool lost, not which ranks: it assumes a pool's losses took
the replicas of the stage it looks at (the fewest survivors a stage can have), so adopters are
never over-counted.  It does not follow ranks either: a rank whose new layers lie within what it
held (the runtime serves it from its own memory) is charged its whole shard from a peer, and a
shard that spans old stages is charged whole over the slowest of their nearest links.  Both err
on the side of a longer load.  A plan without its ``Plan`` (a test planner's) reads the whole checkpoint.

What a change's load sends and is billed for (``load_egress``): the handover's bytes across zones
(``handover_egress``) and, with the checkpoint in a bucket outside a rank's region
(``StateLoad.bucket``, priced by ``network/storage_egress.py`` as the ledger charges what the
engine meters), what the resume reads from it (``restore_egress``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sailor_core.catalog.layers import layer_shapes, total_params
from sailor_core.catalog.models import get_model
from sailor_core.network.model import Endpoint, default_network
from sailor_core.network.storage_egress import BucketPlace
from sailor_core.regimes import DEFAULT_REGIME, get_regime

GpuZone = tuple[str, str]

# The checkpoint store's aggregate read and write bandwidth where none is given: the replay's
# default (``ChangeCosts``) and the train-job flow's, whose job records no timing of its own saves.
DEFAULT_STORAGE_BW_BYTES_PER_S = 1e9


def checkpoint_bytes_for(model: str, regime: str | None = None) -> float:
    """Bytes of one full checkpoint: weights plus optimizer state (gradients are not saved)."""
    r = get_regime(regime or DEFAULT_REGIME)
    return float(total_params(model)) * (r.weight_bytes_per_param + r.optimizer_bytes_per_param)


@dataclass(frozen=True, slots=True, kw_only=True)
class StateLoad:
    """The load of a change: ``storage_load_s`` is the whole checkpoint from storage (what a
    change costs without a handover); ``handover`` off: every change costs that."""

    storage_load_s: float
    storage_bw_bytes_per_s: float
    handover: bool = True
    # The checkpoint's bucket: what a resume reads from it is billed where it lies outside the
    # reading rank's region (``restore_egress``).  None: nothing read is billed (a local folder).
    bucket: BucketPlace | None = None

    @classmethod
    def of_checkpoint(cls, model: str, *, storage_bw_bytes_per_s: float = DEFAULT_STORAGE_BW_BYTES_PER_S,
                      handover: bool = True, bucket: BucketPlace | None = None) -> StateLoad:
        """The load of ``model``'s job whose whole checkpoint (``checkpoint_bytes_for``) storage
        serves at ``storage_bw_bytes_per_s``, from ``bucket``."""
        return cls(storage_load_s=checkpoint_bytes_for(model) / storage_bw_bytes_per_s,
                   storage_bw_bytes_per_s=storage_bw_bytes_per_s, handover=handover, bucket=bucket)

    def load_s(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int]) -> float:
        """Seconds until ``new``'s ranks hold their state, from the ranks of ``holder`` (the layout
        the workers held keep in memory; None: nothing held) that survive: less ``lost`` GPUs
        per pool, and less those ``new`` does not keep."""
        if not self.handover or new is None or holder is None:
            return self.storage_load_s
        peers_s, from_storage = 0.0, {}
        for i, stage, r, rank_bytes, sources in _receivers(new, holder, lost):
            if sources is None:  # (storage serves each byte once at its aggregate bandwidth, as a full reload does)
                from_storage[i] = rank_bytes * _tp(stage)
            else:
                peers_s = max(peers_s, max(_nearest(rank_bytes, pools, (r.gpu, r.zone))[1] for _, _, pools in sources))
        return max(peers_s, sum(from_storage.values()) / self.storage_bw_bytes_per_s)

    def handover_egress(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int]) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, USD) per (source zone, destination zone) that ``load_s``'s handover sends across
        zones: each receiving rank's layers from the holder ``load_s`` weighs them from (a layer
        once, from the first holder stage that has it), priced per pair by the network model the
        simulator's egress uses; nothing without the handover or from storage."""
        if not self.handover or new is None or holder is None:
            return {}
        sent: dict[tuple[str, str], float] = {}
        for _, stage, r, _, sources in _receivers(new, holder, lost):
            covered: set[int] = set()
            for lo, hi, pools in sources or ():
                layers = [i for i in range(max(lo, stage.layer_start), min(hi, stage.layer_end)) if i not in covered]
                covered.update(layers)
                if not layers:
                    continue
                num_bytes = sum(_rank_bytes(new.model, new.regime, i, i + 1, _tp(stage)) for i in layers)
                src = _nearest(num_bytes, pools, (r.gpu, r.zone))[0][1]
                if src != r.zone:
                    sent[(src, r.zone)] = sent.get((src, r.zone), 0.0) + num_bytes * r.tp_degree
        net = default_network()
        return {pair: (n, n * net.egress_usd_per_byte(*pair)) for pair, n in sorted(sent.items())}

    def handover_usd(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int]) -> float:
        """What ``handover_egress`` costs in all."""
        return sum(usd for _, usd in self.handover_egress(new, holder=holder, lost=lost).values())

    def restore_egress(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int]) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, USD) per (bucket, zone) that a resume of ``new`` reads from ``bucket`` where it lies
        outside the reading rank's region, as the engine reads it: rank 0 (stage 0's first replica)
        reads the whole checkpoint to verify it before every rank agrees on it
        (``runtime/worker._agreed_checkpoint``); every rank ``load_s`` weighs from storage (every
        rank without the handover or a holder) reads its stage's layer files whole, each TP rank
        its own copy, plus layer 0's for a tied head (``stage_checkpoint.weight_layers``).  The
        manifest and meta every rank reads (a few KB) are left out; a plan without its ``Plan``
        has no zones to price: nothing."""
        if self.bucket is None or not self.bucket.metered or new is None:
            return {}
        read = {new.stages[0].replicas[0].zone: checkpoint_bytes_for(new.model, new.regime)}
        if not self.handover or holder is None:
            readers = [(stage, r) for stage in new.stages for r in stage.replicas]
        else:
            readers = [(stage, r) for _, stage, r, _, sources in _receivers(new, holder, lost) if sources is None]
        for stage, r in readers:
            read[r.zone] = read.get(r.zone, 0.0) + _files_bytes(new.model, new.regime, stage) * r.tp_degree
        return {(self.bucket.name, zone): (n, n * self.bucket.usd_per_byte(zone))
                for zone, n in sorted(read.items()) if self.bucket.crosses(zone)}

    def load_egress(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int],
                    restores: bool = True) -> dict[tuple[str, str], tuple[float, float]]:
        """(bytes, USD) per pair that a change's load sends: ``handover_egress``'s, and
        ``restore_egress``'s when there is a checkpoint to resume from (``restores``)."""
        out = self.handover_egress(new, holder=holder, lost=lost)
        if restores:
            out.update(self.restore_egress(new, holder=holder, lost=lost))  # (a bucket's pairs: no zone pair's)
        return out

    def load_usd(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int], restores: bool = True) -> float:
        """What ``load_egress`` costs in all: the egress the controller weighs for a change."""
        return sum(usd for _, usd in self.load_egress(new, holder=holder, lost=lost, restores=restores).values())

    def hit_load_s(self, plan: Any) -> float:
        """The load after a hit on ``plan`` that takes one replica of its largest stage: the
        survivors keep their shards, the replacement receives its own (storage where that
        stage has no other replica)."""
        if not self.handover or plan is None:
            return self.storage_load_s
        return _hit_load_s(self, plan)


    def hit_load_usd(self, plan: Any) -> float:
        """The egress of ``hit_load_s``'s load: its handover and its restore (``load_usd``)."""
        if plan is None:
            return 0.0
        return _hit_load_usd(self, plan)


def _hit(plan: Any) -> dict[GpuZone, int]:
    """The GPUs a hit on ``plan`` takes (``hit_load_s``'s): one replica of its largest stage."""
    stage = max(plan.stages, key=lambda s: (s.layer_end - s.layer_start) / _tp(s))
    r = stage.replicas[0]
    return {(r.gpu, r.zone): r.tp_degree}


@lru_cache(maxsize=4096)
def _hit_load_s(load: StateLoad, plan: Any) -> float:
    """``StateLoad.hit_load_s``, kept: every re-plan weighs it for each option (a plan's own)."""
    return load.load_s(plan, holder=plan, lost=_hit(plan))


@lru_cache(maxsize=4096)
def _hit_load_usd(load: StateLoad, plan: Any) -> float:
    return load.load_usd(plan, holder=plan, lost=_hit(plan))


def _receivers(new: Any, holder: Any, lost: Mapping[GpuZone, int]):
    """``new``'s replicas that receive their state, as (stage index, stage, replica, one rank's
    bytes, the (layer start, end, pools) of the surviving holders of its layers, None when some
    no survivor holds: from storage); a replica whose own shard survives adopts it instead."""
    kept = _kept(holder, new, lost)
    survivors = {key: {k: n for k, n in pools.items() if kept.get(k, 0) > 0}
                 for key, pools in _survivors(holder, lost).items()}
    for i, stage in enumerate(new.stages):
        key = (stage.layer_start, stage.layer_end)
        rank_bytes = _rank_bytes(new.model, new.regime, *key, _tp(stage))
        left = dict(survivors.get((*key, _tp(stage)), {})) if stage.zero_stage == 0 else {}
        sources = _sources(survivors, *key) if stage.zero_stage == 0 else None
        for r in stage.replicas:
            pool = (r.gpu, r.zone)
            if left.get(pool, 0) > 0 and kept[pool] >= r.tp_degree:  # its own shard survives: adopted
                left[pool] -= 1
                kept[pool] -= r.tp_degree
            else:
                yield i, stage, r, rank_bytes, sources


def _tp(stage: Any) -> int:
    return stage.replicas[0].tp_degree


def _kept(holder: Any, new: Any, lost: Mapping[GpuZone, int]) -> dict[GpuZone, int]:
    """``holder``'s GPUs per pool that ``new`` keeps: not ``lost``, and no more than ``new`` uses
    there (the instances released with the change take their state with them; the ones kept
    are those whose ranks keep their own shards, where the survivors allow it)."""
    held, wanted = _gpus(holder), _gpus(new)
    return {k: min(wanted.get(k, 0), max(0, n - lost.get(k, 0))) for k, n in held.items()}


def _gpus(plan: Any) -> dict[GpuZone, int]:
    out: dict[GpuZone, int] = {}
    for stage in plan.stages:
        for r in stage.replicas:
            out[(r.gpu, r.zone)] = out.get((r.gpu, r.zone), 0) + r.tp_degree
    return out


def _survivors(holder: Any, lost: Mapping[GpuZone, int]) -> dict[tuple[int, int, int], dict[GpuZone, int]]:
    """Per (layer start, end, TP) of ``holder``'s stages: its replicas per pool that survive,
    a pool's losses charged to each stage in turn (the fewest it can keep)."""
    out: dict[tuple[int, int, int], dict[GpuZone, int]] = {}
    for stage in holder.stages:
        if stage.zero_stage != 0:
            continue
        pools = out.setdefault((stage.layer_start, stage.layer_end, _tp(stage)), {})
        gpus: dict[GpuZone, int] = {}
        for r in stage.replicas:
            gpus[(r.gpu, r.zone)] = gpus.get((r.gpu, r.zone), 0) + r.tp_degree
        for pool, n in gpus.items():
            kept_gpus = max(0, n - lost.get(pool, 0))
            pools[pool] = pools.get(pool, 0) + kept_gpus // _tp(stage)
    return out


def stage_state_bytes(model: str, regime: str | None, layer_start: int, layer_end: int) -> float:
    """The whole state of layers ``[layer_start, layer_end)`` (weights and optimizer state, no
    TP split): what a stage's checkpoint files hold."""
    return _rank_bytes(model, regime, layer_start, layer_end, 1)


def _files_bytes(model: str, regime: str | None, stage: Any) -> float:
    """The layer files one rank of ``stage`` reads to load from the checkpoint: its layers' whole,
    and layer 0's where its head is the tied copy of the embedding (never stored apart)."""
    own = stage_state_bytes(model, regime, stage.layer_start, stage.layer_end)
    tied = get_model(model).tie_embeddings and get_regime(regime or DEFAULT_REGIME).ties_embedding_across_stages
    last = stage.layer_end == len(layer_shapes(model, seq_len=1))
    return own + (stage_state_bytes(model, regime, 0, 1) if tied and last and stage.layer_start > 0 else 0.0)


@lru_cache(maxsize=4096)
def _rank_bytes(model: str, regime: str | None, layer_start: int, layer_end: int, tp_degree: int) -> float:
    """The state one rank of a stage holds: its layers' TP shard of weights and optimizer state."""
    r = get_regime(regime or DEFAULT_REGIME)
    shapes = layer_shapes(model, tp_degree=tp_degree, seq_len=1)
    params = sum(s.params for s in shapes[layer_start:layer_end])
    return float(params) * (r.weight_bytes_per_param + r.optimizer_bytes_per_param)


def _sources(survivors: Mapping[tuple[int, int, int], Mapping[GpuZone, int]], layer_start: int,
             layer_end: int) -> list[tuple[int, int, frozenset[GpuZone]]] | None:
    """(layer start, end, pools holding surviving replicas) of each holder stage that
    ``[layer_start, layer_end)`` overlaps; None when some of those layers no survivor holds."""
    sources, covered = [], set()
    for (lo, hi, _), pools in survivors.items():
        held = frozenset(k for k, n in pools.items() if n > 0)
        if held and lo < layer_end and layer_start < hi:
            sources.append((lo, hi, held))
            covered.update(range(max(lo, layer_start), min(hi, layer_end)))
    return sources if len(covered) == layer_end - layer_start else None


@lru_cache(maxsize=4096)
def _nearest(num_bytes: float, holders: frozenset[GpuZone], pool: GpuZone) -> tuple[GpuZone, float]:
    """The holder a rank in ``pool`` receives ``num_bytes`` from, and the seconds it takes (the
    network model's link; the whole shard over it, though a shard spanning stages comes from
    several): the nearest of those in its own zone, as the runtime prefers them (no egress),
    else the nearest of all."""
    net = default_network()
    dst = Endpoint(gpu=pool[0], zone=pool[1])
    candidates = [h for h in sorted(holders) if h[1] == pool[1]] or sorted(holders)
    return min(((h, net.p2p_time_s(num_bytes, Endpoint(gpu=h[0], zone=h[1]), dst)) for h in candidates),
               key=lambda c: c[1])
