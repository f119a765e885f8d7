"""How long a new plan's ranks take to get the training state: from the ranks that hold it, over
the job's network (``runtime/handover.py``), or from the checkpoint in object storage.

The one model of that load for the controller's cost of a change (``economics.change_s`` and the
cost of a hit) and for the replay (``replay/costs.ChangeCosts``), so both weigh the same seconds.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sailor_core.catalog.layers import layer_shapes
from sailor_core.network.model import Endpoint, default_network
from sailor_core.regimes import DEFAULT_REGIME, get_regime

GpuZone = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class StateLoad:
    """The load of a change: ``storage_load_s`` is the whole checkpoint from storage (what a
    change costs without a handover); ``handover`` off: every change costs that."""

    storage_load_s: float
    storage_bw_bytes_per_s: float
    handover: bool = True

    def load_s(self, new: Any, *, holder: Any, lost: Mapping[GpuZone, int]) -> float:
        """Seconds until ``new``'s ranks hold their state, from the ranks of ``holder`` (the layout
        the workers held keep in memory; None: nothing held) that survive: less ``lost`` GPUs
        per pool, and less those ``new`` does not keep."""
        if not self.handover or new is None or holder is None:
            return self.storage_load_s
        kept = _kept(holder, new, lost)
        survivors = {key: {k: n for k, n in pools.items() if kept.get(k, 0) > 0}
                     for key, pools in _survivors(holder, lost).items()}
        peers_s, storage_bytes = 0.0, 0.0
        for stage in new.stages:
            key = (stage.layer_start, stage.layer_end)
            rank_bytes = _rank_bytes(new.model, new.regime, *key, _tp(stage))
            left = dict(survivors.get((*key, _tp(stage)), {})) if stage.zero_stage == 0 else {}
            sources = _sources(survivors, *key) if stage.zero_stage == 0 else None
            from_storage = False
            for r in stage.replicas:
                pool = (r.gpu, r.zone)
                if left.get(pool, 0) > 0 and kept[pool] >= r.tp_degree:  # its own shard survives: adopted
                    left[pool] -= 1
                    kept[pool] -= r.tp_degree
                elif sources is not None:
                    peers_s = max(peers_s, max(_receive_s(rank_bytes, pools, pool) for pools in sources))
                else:
                    from_storage = True
            # (storage serves each byte once at its aggregate bandwidth, as a full reload does)
            storage_bytes += rank_bytes * _tp(stage) if from_storage else 0.0
        return max(peers_s, storage_bytes / self.storage_bw_bytes_per_s)

    def hit_load_s(self, plan: Any) -> float:
        """The load after a hit on ``plan`` that takes one replica of its largest stage: the
        survivors keep their shards, the replacement receives its own (storage where that
        stage has no other replica)."""
        if not self.handover or plan is None:
            return self.storage_load_s
        return _hit_load_s(self, plan)


@lru_cache(maxsize=4096)
def _hit_load_s(load: StateLoad, plan: Any) -> float:
    """``StateLoad.hit_load_s``, kept: every re-plan weighs it for each option (a plan's own)."""
    stage = max(plan.stages, key=lambda s: (s.layer_end - s.layer_start) / _tp(s))
    r = stage.replicas[0]
    return load.load_s(plan, holder=plan, lost={(r.gpu, r.zone): r.tp_degree})


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


@lru_cache(maxsize=4096)
def _rank_bytes(model: str, regime: str | None, layer_start: int, layer_end: int, tp_degree: int) -> float:
    """The state one rank of a stage holds: its layers' TP shard of weights and optimizer state."""
    r = get_regime(regime or DEFAULT_REGIME)
    shapes = layer_shapes(model, tp_degree=tp_degree, seq_len=1)
    params = sum(s.params for s in shapes[layer_start:layer_end])
    return float(params) * (r.weight_bytes_per_param + r.optimizer_bytes_per_param)


def _sources(survivors: Mapping[tuple[int, int, int], Mapping[GpuZone, int]], layer_start: int,
             layer_end: int) -> list[frozenset[GpuZone]] | None:
    """The pools holding surviving replicas of each holder stage that ``[layer_start, layer_end)``
    overlaps; None when some of those layers no survivor holds."""
    sources, covered = [], set()
    for (lo, hi, _), pools in survivors.items():
        held = frozenset(k for k, n in pools.items() if n > 0)
        if held and lo < layer_end and layer_start < hi:
            sources.append(held)
            covered.update(range(max(lo, layer_start), min(hi, layer_end)))
    return sources if len(covered) == layer_end - layer_start else None


@lru_cache(maxsize=4096)
def _receive_s(num_bytes: float, holders: frozenset[GpuZone], pool: GpuZone) -> float:
    """One rank in ``pool`` receiving ``num_bytes`` from the nearest of ``holders`` (the network
    model's link; the whole shard over it, though a shard spanning stages comes from several)."""
    net = default_network()
    dst = Endpoint(gpu=pool[0], zone=pool[1])
    return min(net.p2p_time_s(num_bytes, Endpoint(gpu=g, zone=z), dst) for g, z in sorted(holders))
