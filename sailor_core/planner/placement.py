"""Where a segment's replicas go: zones per stage, keeping rings and links inside a zone when they can.

Two deterministic rules, both searched:

* ``stage``: each stage's replicas in one zone when one has room (the DP ring
  stays inside a zone; consecutive stages prefer the previous stage's zone,
  then its region, so p2p links stay short); otherwise spread over the zones
  with the most room, same region first.
* ``pipeline``: replica j of every stage in the same zone (a whole pipeline per
  zone: p2p stays inside a zone, the DP ring crosses zones).
"""

from __future__ import annotations

import functools

from sailor_core.zones import parse_zone, ring_order_key

# (zone, replicas) in ring/routing order: zones by ``zones.ring_order_key``, so a ring crosses
# each cloud, continent, region and zone boundary as few times as a ring can
StagePlacement = tuple[tuple[str, int], ...]


@functools.lru_cache(maxsize=1024)
def _region(zone: str) -> str:
    return parse_zone(zone).region


def place_stages(zone_gpus: dict[str, int], tp_degree: int, dp_degree: int, num_stages: int,
                 prev_zone: str | None = None) -> tuple[StagePlacement, ...] | None:
    # Searches and replays place the same segments over and over: the rule is pure, so cache it.
    return _place_stages(tuple(sorted(zone_gpus.items())), tp_degree, dp_degree, num_stages, prev_zone)


@functools.lru_cache(maxsize=1 << 16)
def _place_stages(zone_gpus: tuple[tuple[str, int], ...], tp_degree: int, dp_degree: int, num_stages: int,
                  prev_zone: str | None) -> tuple[StagePlacement, ...] | None:
    rem = {z: n // tp_degree for z, n in zone_gpus}
    regions = {z: _region(z) for z in rem}  # (the sort keys below ask for them per stage)
    out: list[StagePlacement] = []
    prev = prev_zone
    if num_stages > 1:
        # Stage by stage, each from the room the earlier ones left: the first num_stages - 1 are
        # the shorter segment's placement (the bounds place a degree at every depth in turn).
        head = _place_stages(zone_gpus, tp_degree, dp_degree, num_stages - 1, prev_zone)
        if head is None:
            return None
        for stage in head:
            for z, n in stage:
                rem[z] -= n
        out.extend(head)
        prev = max(head[-1], key=lambda p: (p[1], p[0]))[0]
    for _ in range(min(num_stages, 1)):
        prev_region = _region(prev) if prev else None

        def near(z: str) -> tuple:
            return (z != prev, regions[z] != prev_region, -rem[z], z)

        order = sorted((z for z in rem if rem[z] > 0), key=near)
        single = next((z for z in order if rem[z] >= dp_degree), None)
        if single is not None:
            rem[single] -= dp_degree
            out.append(((single, dp_degree),))
            prev = single
            continue
        need = dp_degree
        parts: list[tuple[str, int]] = []
        for z in sorted(order, key=lambda z: (regions[z] != prev_region, -rem[z], z)):
            take = min(need, rem[z])
            if take:
                parts.append((z, take))
                rem[z] -= take
                need -= take
            if not need:
                break
        if need:
            return None
        parts.sort(key=lambda p: ring_order_key(p[0]))
        out.append(tuple(parts))
        prev = max(parts, key=lambda p: (p[1], p[0]))[0]
    return tuple(out)


def place_pipelines(zone_gpus: dict[str, int], tp_degree: int, dp_degree: int,
                    num_stages: int) -> tuple[StagePlacement, ...] | None:
    per_zone = {z: n // (tp_degree * num_stages) for z, n in zone_gpus.items()}
    if sum(per_zone.values()) < dp_degree:
        return None
    need = dp_degree
    parts: list[tuple[str, int]] = []
    for z in sorted(per_zone, key=lambda z: (-per_zone[z], z)):
        take = min(need, per_zone[z])
        if take:
            parts.append((z, take))
            need -= take
        if not need:
            break
    parts.sort(key=lambda p: ring_order_key(p[0]))
    return (tuple(parts),) * num_stages


def placements(zone_gpus: dict[str, int], tp_degree: int, dp_degree: int,
               num_stages: int) -> list[tuple[str, tuple[StagePlacement, ...]]]:
    """The distinct placements of ``num_stages`` stages of ``dp_degree`` replicas of ``tp_degree`` GPUs."""
    found: list[tuple[str, tuple[StagePlacement, ...]]] = []
    a = place_stages(zone_gpus, tp_degree, dp_degree, num_stages)
    if a is not None:
        found.append(("stage", a))
    if len([z for z, n in zone_gpus.items() if n]) > 1:
        b = place_pipelines(zone_gpus, tp_degree, dp_degree, num_stages)
        if b is not None and b != a:
            found.append(("pipeline", b))
    return found
