"""ProfileDB.get: measured where present, estimated (and saying from what) elsewhere."""

import pytest

from sailor_core.catalog.models import get_model, tp_split_problem
from sailor_core.errors import ProfileError, UnknownNameError
from sailor_core.profiles import ProfileDB, default_profile_db


def test_shipped_data_needs_no_import_step():
    db = default_profile_db()
    keys = db.measured_keys()
    assert ("opt-350m", "A100-40", 1, 1, 2048) in keys and ("opt-1.3b", "H200", 1, 4, 2048) in keys
    gpus = {k[1] for k in keys}
    assert {"A100-40", "A100-80", "V100-16", "GH-96", "RTX-2080", "RTX-3090", "Titan-RTX", "H200"} <= gpus


def test_measured_profile_is_returned_as_is():
    db = default_profile_db()
    p = db.get("OPT-350", "a100", 1, 2)  # Sailor's spellings are accepted
    assert p.model == "opt-350m" and p.gpu == "A100-40" and p.measured
    assert p.source == "sailor:simulations/profiles_tmp.json"
    assert db.get("opt-350m", "A100-40", 1, 2) is p  # cached answer, same object


def test_missing_mbs_is_scaled_from_the_same_gpu():
    db = default_profile_db()
    p = db.get("opt-350m", "A100-40", 1, 16)
    assert not p.measured and not any(layer.measured for layer in p.layers)
    assert "scaled from measured A100-40 tp 1 mbs 8" in p.source
    eight = db.get("opt-350m", "A100-40", 1, 8)
    assert 1.6 < p.fwd_bwd_s() / eight.fwd_bwd_s() < 2.2
    assert p.layers[3].activation_bytes == pytest.approx(2 * eight.layers[3].activation_bytes, rel=0.01)
    assert p.params() == eight.params()  # Sailor's own model (untied head, padded vocab) is kept


def test_other_sequence_length_is_scaled():
    db = default_profile_db()
    short = db.get("llama-3-8b", "GH-96", 1, 1, 2048)  # Sailor profiled LLaMA at 8192 only
    full = db.get("llama-3-8b", "GH-96", 1, 1)
    assert full.measured and full.seq_len == 8192
    assert not short.measured and "seq 8192" in short.source
    assert short.fwd_bwd_s() < full.fwd_bwd_s() / 3  # 4x fewer tokens, attention quadratic
    assert short.layers[5].activation_bytes < full.layers[5].activation_bytes / 4  # the s^2 scores shrink 16x
    assert short.layers[5].params == full.layers[5].params


def test_unprofiled_gpu_from_the_closest_profiled_one():
    db = default_profile_db()
    p = db.get("opt-350m", "H100-80", 1, 4, regime="megatron-fp32-adamw")
    assert not p.measured and "from GH-96" in p.source
    gh = db.get("opt-350m", "GH-96", 1, 4)
    assert 0.5 < p.fwd_bwd_s() / gh.fwd_bwd_s() < 2  # a similar GPU: similar time
    assert not p.update_measured and p.update_s(10**9) > 0


@pytest.mark.parametrize("gpu", ["H100-80", "L4", "A100-40", "H200"])
def test_estimates_are_monotone_in_micro_batch(gpu):
    db = default_profile_db()
    times = [db.get("opt-1.3b", gpu, 1, b).fwd_bwd_s() for b in (1, 2, 3, 4, 6, 8, 16, 32)]
    assert times == sorted(times) and times[0] > 0
    acts = [db.get("opt-1.3b", gpu, 1, b).layers[4].activation_bytes for b in (1, 2, 4, 8)]
    assert acts == sorted(acts)


def test_tp_shards_parameters_and_activations():
    db = default_profile_db()
    for gpu in ("H100-80", "H200"):
        one, four = db.get("llama-3.2-1b", gpu, 1, 2), db.get("llama-3.2-1b", gpu, 4, 2)
        assert four.layers[3].params < one.layers[3].params / 3
        assert four.layers[3].activation_bytes < one.layers[3].activation_bytes
        assert four.layers[3].fwd_s < one.layers[3].fwd_s


def test_regime_restricts_the_data_used():
    db = default_profile_db()
    bf16 = db.get("opt-350m", "A100-40", 1, 2, regime="torch-bf16-autocast-adamw")
    assert bf16.regime == "torch-bf16-autocast-adamw" and not bf16.measured
    assert db.get("opt-350m", "A100-40", 1, 2).regime == "megatron-fp32-adamw"


def test_the_regime_every_measurement_shares_gets_the_same_estimate_as_none():
    # opt-350m on A100-40 is measured under megatron-fp32 alone, and not at TP 8: asking with that
    # regime or none reads the same profiles, so it is one estimate (the planner asks both)
    db = default_profile_db()
    plain = db.get("opt-350m", "A100-40", 8, 16)
    assert not plain.measured and plain.regime == "megatron-fp32-adamw"
    assert db.get("opt-350m", "A100-40", 8, 16, regime="megatron-fp32-adamw") is plain
    assert db.get("opt-350m", "A100-40", 8, 16, regime="torch-bf16-autocast-adamw") is not plain


def test_nothing_profiled_anywhere_still_answers():
    p = ProfileDB().get("tiny", "cpu", 1, 2)
    assert not p.measured and "uncalibrated" in p.source and p.fwd_bwd_s() > 0
    assert len(p.layers) == 4


def test_add_replaces_and_invalidates(h200_profiles):
    db = ProfileDB(h200_profiles)
    before = db.get("opt-2.7b", "H200", 1, 16)
    assert "scaled from measured H200 tp 1 mbs 8" in before.source
    db.add(h200_profiles[0])
    assert db.get("opt-2.7b", "H200", 1, 16) is not before  # answers recomputed after add


def test_bad_requests():
    db = default_profile_db()
    with pytest.raises(UnknownNameError, match="unknown model"):
        db.get("gpt-5", "A100-40", 1, 1)
    with pytest.raises(UnknownNameError, match="unknown GPU"):
        db.get("opt-350m", "B300", 1, 1)
    with pytest.raises(ProfileError, match="cannot run at TP 3: TP degree 3 does not divide opt-350m's 16 attention heads"):
        db.get("opt-350m", "A100-40", 3, 1)
    with pytest.raises(ProfileError, match="at most 2048 tokens"):
        db.get("opt-350m", "A100-40", 1, 1, 4096)
    with pytest.raises(ValueError, match="micro-batch size must be a positive integer"):
        db.get("opt-350m", "A100-40", 1, -2)


def test_profile_with_wrong_layer_count_is_refused(h200_profiles):
    from dataclasses import replace

    p = h200_profiles[0]
    with pytest.raises(ProfileError, match="layer indices"):
        ProfileDB([replace(p, layers=p.layers[:-1])])


_MODELS = ["opt-350m", "opt-1.3b", "opt-30b", "gpt-neo-2.7b", "llama-3.2-1b", "llama-3-8b", "tiny"]
_GPUS = ["A100-40", "A100-80", "H100-80", "H200", "GH-96", "V100-16", "T4", "L4", "A10G", "RTX-3090"]
_TPS = (1, 2, 4, 8)
_MICRO_BATCHES = range(1, 65)  # every size the planner tries (powers of two up to 64) and all between


@pytest.mark.parametrize("model", _MODELS)
def test_estimates_never_get_faster_with_more_work(model):
    """Where the model was never measured on a GPU, a bigger micro-batch never takes less time, in
    the whole model or in any layer's forward or backward (so in no pipeline stage), nor holds
    fewer activation bytes; a smaller TP degree never holds fewer parameters (measured data may
    break the first: the H200 ran OPT-350m faster at mbs 2 than 1).  Every GPU, TP degree and
    micro-batch size 1..64 is checked, so a break fails every run (a few seconds per model)."""
    db = default_profile_db()
    spec = get_model(model)
    measured_on = {k[1] for k in db.measured_keys() if k[0] == spec.name}
    broken = []
    for gpu in (g for g in _GPUS if g not in measured_on):
        tps = [tp for tp in _TPS if tp_split_problem(spec, tp) is None]
        for tp in tps:
            before = None
            for mbs in _MICRO_BATCHES:
                p = db.get(model, gpu, tp, mbs)
                if before is not None:
                    if p.fwd_bwd_s() < before.fwd_bwd_s() * (1 - 1e-9):
                        broken.append(
                            f"{gpu} tp {tp}: mbs {mbs - 1} {before.fwd_bwd_s():.6g} s, mbs {mbs} {p.fwd_bwd_s():.6g} s"
                        )
                    for i, (a, b) in enumerate(zip(before.layers, p.layers, strict=True)):
                        if b.fwd_s < a.fwd_s * (1 - 1e-9) or b.bwd_s < a.bwd_s * (1 - 1e-9):
                            broken.append(f"{gpu} tp {tp} layer {i}: fwd/bwd {a.fwd_s:.6g}/{a.bwd_s:.6g} s at mbs "
                                          f"{mbs - 1}, {b.fwd_s:.6g}/{b.bwd_s:.6g} s at mbs {mbs}")
                        if b.activation_bytes < a.activation_bytes:
                            broken.append(f"{gpu} tp {tp} layer {i}: fewer activation bytes at mbs {mbs}")
                before = p
        for mbs in _MICRO_BATCHES:
            for wide, narrow in zip(tps, tps[1:]):
                if db.get(model, gpu, wide, mbs).params() < db.get(model, gpu, narrow, mbs).params():
                    broken.append(f"{gpu} mbs {mbs}: fewer params at tp {wide} than at tp {narrow}")
    assert not broken, f"{len(broken)} breaks, e.g.\n" + "\n".join(broken[:20])
