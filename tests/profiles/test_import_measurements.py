"""The measurements importer: per-layer costs by differencing the two depths of each model."""

import json

import pytest

from sailor_core.catalog.layers import total_params
from sailor_core.errors import ProfileError
from sailor_core.profiles.import_measurements import import_measurements

from .conftest import MEASUREMENTS

JSONL = MEASUREMENTS / "h200_opt_training.jsonl"


def _records():
    return {(r["model"], r["layers"], r["mbs"]): r for r in map(json.loads, JSONL.read_text().splitlines()[1:])}


def test_one_profile_per_model_and_mbs(h200_profiles):
    assert {(p.model, p.micro_batch_size) for p in h200_profiles} == {
        (m, b) for m in ("opt-350m", "opt-1.3b", "opt-2.7b") for b in (1, 2, 4, 8)
    }
    assert all(p.gpu == "H200" and p.regime == "torch-bf16-autocast-adamw" and p.measured for p in h200_profiles)


def test_blocks_by_differencing_and_totals_preserved(h200_profiles):
    rec = _records()
    p = next(p for p in h200_profiles if p.model == "opt-1.3b" and p.micro_batch_size == 4)
    full, short = rec[("opt-1.3b", 24, 4)], rec[("opt-1.3b", 2, 4)]
    block_fwd = (full["fwd_nograd_ms"][0] - short["fwd_nograd_ms"][0]) / 22 / 1e3
    block_fb = (full["fwd_bwd_ms"][0] - short["fwd_bwd_ms"][0]) / 22 / 1e3
    assert p.layers[5].fwd_s == pytest.approx(block_fwd)
    assert p.layers[5].fwd_s + p.layers[5].bwd_s == pytest.approx(block_fb)
    # the layers add back up to the measured full-depth forward and forward+backward
    assert sum(layer.fwd_s for layer in p.layers) == pytest.approx(full["fwd_nograd_ms"][0] / 1e3)
    assert p.fwd_bwd_s() == pytest.approx(full["fwd_bwd_ms"][0] / 1e3)
    assert p.params() == full["params"] == total_params("opt-1.3b")
    block_act = ((full["peak_alloc_bytes"] - full["static_bytes"]) - (short["peak_alloc_bytes"] - short["static_bytes"])) / 22
    assert p.layers[5].activation_bytes == pytest.approx(block_act, abs=1)


def test_optimizer_step_is_linear_in_parameters(h200_profiles):
    rec = _records()
    p = h200_profiles[0]
    for key in (("opt-2.7b", 32, 1), ("opt-350m", 2, 1), ("opt-1.3b", 24, 8)):
        r = rec[key]
        assert p.update_s(r["params"]) == pytest.approx(r["optim_step_ms"][0] / 1e3, rel=0.2)


def test_corrupt_measurements_are_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(JSONL.read_text().splitlines()[1] + "\n{not json\n")
    with pytest.raises(ProfileError, match=r"bad.jsonl:2: not JSON"):
        import_measurements(bad)
    bad.write_text(json.dumps({"model": "opt-350m", "layers": 24}) + "\n")
    with pytest.raises(ProfileError, match="missing"):
        import_measurements(bad)
    record = json.loads(JSONL.read_text().splitlines()[1])
    bad.write_text(json.dumps({**record, "mbs": "two"}) + "\n")
    with pytest.raises(ProfileError, match="mbs must be non-negative integers"):
        import_measurements(bad)
    only_full = tmp_path / "full.jsonl"
    only_full.write_text("\n".join(JSONL.read_text().splitlines()[:3]) + "\n")
    with pytest.raises(ProfileError, match="both its full depth and 2 blocks"):
        import_measurements(only_full)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="no \\*.jsonl"):
        import_measurements(tmp_path / "empty")
