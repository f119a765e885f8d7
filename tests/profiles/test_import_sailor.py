"""The Sailor importer on the real data/sailor_data files, oddities included."""

import json
import shutil

import pytest

from sailor_core.errors import ProfileError
from sailor_core.profiles.import_sailor import import_sailor

from .conftest import SAILOR_DATA


def _one(profiles, model, gpu, tp, mbs):
    (p,) = [p for p in profiles if (p.model, p.gpu, p.tp_degree, p.micro_batch_size) == (model, gpu, tp, mbs)]
    return p


def test_readme_sample_opt350_gh96(sailor_profiles):
    p = _one(sailor_profiles, "opt-350m", "GH-96", 1, 1)
    assert p.seq_len == 2048 and p.regime == "megatron-fp32-adamw" and p.measured
    assert len(p.layers) == 26
    assert (p.layers[0].fwd_s, p.layers[0].bwd_s) == (0.00022, 2e-6)
    assert (p.layers[1].fwd_s, p.layers[1].bwd_s) == (0.001403, 0.002685)
    assert all((layer.fwd_s, layer.bwd_s) == (0.001225, 0.002685) for layer in p.layers[2:25])
    assert (p.layers[25].fwd_s, p.layers[25].bwd_s) == pytest.approx((0.002068, 0.002109))
    # sizes from llm_info.json (mbs 1): block params and activation, last index sends nothing
    assert p.layers[1].params == 12_596_224 and p.layers[1].activation_bytes == 360_726_528
    assert p.layers[0].output_bytes == 2048 * 1024 * 4 and p.layers[25].output_bytes == 0
    # update_s (0.001337 s) is the whole mini-model's step: embedding + 2 blocks + head
    mini = p.layers[0].params + 2 * p.layers[1].params + p.layers[25].params
    assert p.update_measured and p.update_s(mini) == pytest.approx(0.001337)


def test_activation_and_output_scale_with_micro_batch(sailor_profiles):
    one, eight = _one(sailor_profiles, "opt-350m", "GH-96", 1, 1), _one(sailor_profiles, "opt-350m", "GH-96", 1, 8)
    assert eight.layers[3].activation_bytes == 8 * one.layers[3].activation_bytes
    assert eight.layers[3].output_bytes == 8 * one.layers[3].output_bytes
    assert eight.layers[3].params == one.layers[3].params


def test_profiles_tmp_preferred_and_broken_planner_copy_ignored(sailor_profiles):
    neo = [p for p in sailor_profiles if p.model == "gpt-neo-2.7b" and p.gpu == "GH-96"]
    assert neo and all(len(p.layers) == 34 and "profiles_tmp" in p.source for p in neo)
    # the real GPT-Neo profile covers mbs 1..32 (tp 1,2,4) and 64 (tp 2,4)
    assert {(p.micro_batch_size, p.tp_degree) for p in neo} == {
        *((b, t) for b in (1, 2, 4, 8, 16, 32) for t in (1, 2, 4)), (64, 2), (64, 4)
    }
    # OPT-350/A100-80 exists in both: profiles_tmp's newer run, stopping at mbs 64
    a100 = [p for p in sailor_profiles if p.model == "opt-350m" and p.gpu == "A100-80"]
    assert all("profiles_tmp" in p.source for p in a100) and max(p.micro_batch_size for p in a100) == 64


def test_opt30_gh96_only_in_planner_profiles(sailor_profiles):
    opt30 = [p for p in sailor_profiles if p.model == "opt-30b" and p.gpu == "GH-96"]
    assert opt30 and all(p.source == "sailor:planner_profiles/OPT-30/GH-96" for p in opt30)
    assert {(p.micro_batch_size, p.tp_degree) for p in opt30 if p.micro_batch_size >= 16} == {(16, 2), (16, 4), (32, 4)}


def test_missing_pairs_stay_unknown(sailor_profiles):
    keys = {(p.model, p.gpu, p.tp_degree, p.micro_batch_size) for p in sailor_profiles}
    assert ("opt-350m", "A100-40", 1, 8) in keys
    assert ("opt-350m", "A100-40", 1, 16) not in keys  # OOM or never run: absent, not zero
    assert ("opt-350m", "V100-16", 1, 8) not in keys  # V100 mbs 8 only at tp 2,4,8
    assert all(layer.fwd_s > 0 for p in sailor_profiles for layer in p.layers[1:])


def test_tp_without_llm_info_sizes_derives_from_tp1(sailor_profiles):
    tp1 = _one(sailor_profiles, "opt-30b", "A100-40", 1, 1)
    tp8 = _one(sailor_profiles, "opt-30b", "V100-16", 8, 1)  # llm_info has OPT-30 sizes for tp 1, 2, 4 only
    assert tp8.layers[2].params == -(-tp1.layers[2].params // 8)
    assert tp8.layers[2].activation_bytes == -(-tp1.layers[2].activation_bytes // 8)
    assert tp8.layers[2].output_bytes == tp1.layers[2].output_bytes


def test_llama_final_norm_and_head_merged(sailor_profiles):
    raw = json.loads((SAILOR_DATA / "simulations" / "profiles_tmp.json").read_text())["LLAMA-3-8"]["GH-96"]["1"]["1"]
    p = _one(sailor_profiles, "llama-3-8b", "GH-96", 1, 1)
    assert p.seq_len == 8192 and len(p.layers) == 34
    assert p.layers[33].fwd_s == pytest.approx(raw["33"][0] + raw["34"][0])
    assert p.layers[33].params == 4096 + 4096 + 50304 * 4096  # two norms' llm_info entries + the uncounted head


def test_old_generation_zero_update_is_estimated(sailor_profiles):
    old = _one(sailor_profiles, "gpt-neo-2.7b", "A100-80", 1, 1)  # update_s = 0 in every source
    assert not old.update_measured and old.update_s_per_param > 0
    a100_80_measured = _one(sailor_profiles, "opt-350m", "A100-80", 1, 1)
    assert a100_80_measured.update_measured
    assert old.update_s_per_param == pytest.approx(a100_80_measured.update_s_per_param, rel=0.5)


def test_corrupt_sailor_folder_is_one_clear_error(tmp_path):
    root = tmp_path / "sailor_data"
    shutil.copytree(SAILOR_DATA / "planner", root / "planner")
    (root / "simulations").mkdir()
    (root / "simulations" / "profiles_tmp.json").write_text('{"OPT-350": {"A100-40": {"1": ')
    with pytest.raises(ProfileError, match="profiles_tmp.json: not readable JSON"):
        import_sailor(root)
    (root / "simulations" / "profiles_tmp.json").write_text(
        json.dumps({"OPT-350": {"A100-40": {"1": {"1": {str(i): ["x", 0, 0] for i in range(26)}}}}})
    )
    with pytest.raises(ProfileError, match="OPT-350/A100-40 mbs 1 tp 1"):
        import_sailor(root)
    (root / "simulations" / "profiles_tmp.json").write_text(json.dumps({"OPT-350": {"A100-40": {"1": [0.1]}}}))
    with pytest.raises(ProfileError, match="OPT-350/A100-40: expected {mbs: {tp:"):
        import_sailor(root)
    with pytest.raises(ProfileError, match="not a directory"):
        import_sailor(tmp_path / "nowhere")
