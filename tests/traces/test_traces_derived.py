"""The derived multi-day traces reproduce the statistics they were derived from."""

import pytest

from sailor_core.errors import InputError
from sailor_core.traces import (
    MEASURED_BEHAVIOURS,
    PoolSpec,
    derive_preset,
    derive_trace,
    load_gpu_trace,
    load_trace,
    pool_statistics,
    write_gpu_trace,
)

H = 3600.0


@pytest.mark.parametrize("behaviour", sorted(MEASURED_BEHAVIOURS))
def test_long_derived_pool_matches_its_source(behaviour):
    b = MEASURED_BEHAVIOURS[behaviour]
    t = derive_trace([PoolSpec(gpu="V100-16", zone="us-east-1a", capacity=32, behaviour=behaviour)],
                     duration_s=12 * 24 * H, seed=7, stockouts=False)
    s = pool_statistics(t, t.keys[0])
    assert s.duration_s / s.num_preemption_events == pytest.approx(b.mtbp_s, rel=0.2)
    assert s.mean_count / 32 == pytest.approx(b.mean_available_fraction, abs=0.08)
    assert s.largest_drop <= max(1, round(b.largest_bulk_fraction * 32))


def test_presets_are_multi_day_multi_zone_multi_gpu_and_deterministic():
    for name in ("aws-3d", "gcp-4d"):
        t = derive_preset(name, seed=3)
        assert t.duration_s >= 3 * 24 * H
        assert len(t.gpu_types()) >= 2 and len(t.zones()) >= 3
        assert len(t.preemptions) > 100
        assert t.rows == derive_preset(name, seed=3).rows
        assert t.rows != derive_preset(name, seed=4).rows


def test_round_trip_through_sailor_csv(tmp_path):
    t = load_trace("derived:gcp-4d:1")
    p = tmp_path / "d.csv"
    write_gpu_trace(t, p)
    back = load_gpu_trace(p)
    assert back.keys == t.keys
    assert [c for _, c in back.rows] == [c for _, c in t.rows]
    assert [r[0] for r in back.rows] == pytest.approx([r[0] for r in t.rows], abs=1e-3)
    assert len(back.preemptions) == len(t.preemptions)


def test_bad_derived_names():
    with pytest.raises(InputError, match="unknown derived trace"):
        load_trace("derived:nope")
    with pytest.raises(InputError, match="behaviour"):
        derive_trace([PoolSpec(gpu="T4", zone="us-east-1a", capacity=4, behaviour="x")], duration_s=H)
