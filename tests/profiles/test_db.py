"""ProfileDB.get: measured where present, estimated (and saying from what) elsewhere."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sailor_core.catalog.models import get_model
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
    with pytest.raises(ProfileError, match="heads do not split 3 ways"):
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


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_MODELS), st.sampled_from(_GPUS), st.sampled_from([1, 2, 4, 8]), st.integers(1, 63), st.integers(1, 64))
def test_estimates_never_get_faster_with_more_work(model, gpu, tp, mbs, more):
    """Where the model was never measured on this GPU, a bigger micro-batch or a smaller TP
    degree never takes less time (measured data may: the H200 ran OPT-350m faster at mbs 2 than 1)."""
    db = default_profile_db()
    assume(get_model(model).num_heads % tp == 0)
    assume(not any(k[0] == get_model(model).name and k[1] == gpu for k in db.measured_keys()))
    small, big = db.get(model, gpu, tp, mbs), db.get(model, gpu, tp, mbs + more)
    assert small.fwd_bwd_s() <= big.fwd_bwd_s() * (1 + 1e-9)
    assert small.layers[1].activation_bytes <= big.layers[1].activation_bytes
    if tp > 1:
        wider = db.get(model, gpu, tp // 2, mbs)
        assert wider.params() >= small.params()
