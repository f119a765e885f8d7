"""The ``stage`` placement rule (``planner/placement.py``), built on the shorter segment's placement,
against the rule applied stage by stage from the pools."""

import random

from sailor_core.planner.placement import place_stages
from sailor_core.zones import parse_zone, ring_order_key


def _reference(zone_gpus: dict[str, int], tp: int, dp: int, num_stages: int, prev_zone):
    """The rule of the module docstring, every stage from the room the earlier ones left."""
    rem = {z: n // tp for z, n in sorted(zone_gpus.items())}
    out, prev = [], prev_zone
    for _ in range(num_stages):
        prev_region = parse_zone(prev).region if prev else None
        order = sorted((z for z in rem if rem[z] > 0),
                       key=lambda z: (z != prev, parse_zone(z).region != prev_region, -rem[z], z))
        single = next((z for z in order if rem[z] >= dp), None)
        if single is not None:
            rem[single] -= dp
            out.append(((single, dp),))
            prev = single
            continue
        need, parts = dp, []
        for z in sorted(order, key=lambda z: (parse_zone(z).region != prev_region, -rem[z], z)):
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


def test_stage_placements_are_the_rule_applied_stage_by_stage():
    zones = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b",
             "europe-west4-a", "us-east1-c"]
    rng = random.Random(5)
    placed = 0
    for _ in range(3000):
        pools = {z: rng.choice([0, 1, 2, 4, 8, 16, 32, 64, 128]) for z in rng.sample(zones, rng.randint(1, 6))}
        tp, dp, stages = rng.choice([1, 2, 4, 8]), rng.randint(1, 80), rng.randint(0, 12)
        prev = rng.choice([None, *pools])
        got = place_stages(pools, tp, dp, stages, prev)
        assert got == _reference(pools, tp, dp, stages, prev), (pools, tp, dp, stages, prev)
        placed += got is not None and stages > 1
    assert placed > 300  # (the deep placements, built on shorter ones, are exercised)
