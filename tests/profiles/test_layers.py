"""Per-layer sizes from the architecture, against hand counts and the H200 measurements."""

import json

import pytest

from sailor_core.catalog.layers import layer_shapes, total_params
from sailor_core.errors import InputError

from .conftest import MEASUREMENTS


def test_opt_350m_parameters_by_hand():
    h, f, v, e = 1024, 4096, 50272, 512
    embedding = v * e + 2050 * h + e * h  # tokens (512 wide), positions (+2 offset), project_in
    block = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h
    head = h * e  # project_out; post-LN OPT-350m has no final norm, the head is tied
    shapes = layer_shapes("opt-350m")
    assert [s.params for s in shapes] == [embedding] + [block] * 24 + [head]
    assert total_params("opt-350m") == 331_196_416  # = measurements' `params`


@pytest.mark.parametrize("model", ["opt-350m", "opt-1.3b", "opt-2.7b"])
def test_totals_match_the_measured_models(model):
    records = [json.loads(line) for line in (MEASUREMENTS / "h200_opt_training.jsonl").read_text().splitlines()[1:]]
    measured = {r["params"] for r in records if r["model"] == model and r["layers"] > 2}
    assert measured == {total_params(model)}


def test_llama_3_8b_with_gqa_and_swiglu():
    h, f, kv, v = 4096, 14336, 8 * 128, 128256
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    assert layer_shapes("llama-3-8b")[1].params == block
    assert total_params("llama-3-8b") == v * h + 32 * block + h + v * h == 8_030_261_248


def test_tp_shards_matmuls_and_replicates_norms():
    one, two = layer_shapes("opt-1.3b", tp_degree=1)[1], layer_shapes("opt-1.3b", tp_degree=2)[1]
    h = 2048
    replicated = h + h + 4 * h  # out-proj and fc2 biases, two LayerNorms
    assert two.params == (one.params - replicated) // 2 + replicated
    assert two.fwd_flops_per_token == pytest.approx(one.fwd_flops_per_token / 2)
    assert two.activation_bytes_per_seq < one.activation_bytes_per_seq
    assert two.output_bytes_per_seq == one.output_bytes_per_seq  # the residual stream is whole on every rank



def test_gqa_kv_heads_split_over_tp_and_a_tp_above_them_is_refused_as_the_engine_does():
    # tiny-llama: h 64, 4 heads of 16, 2 KV heads, FFN 192; at TP 2 each GPU keeps one whole KV head
    h, d, f, t = 64, 16, 192, 2
    block = layer_shapes("tiny-llama", tp_degree=t)[1]
    assert block.params == h * (h // t) + 2 * h * d + (h // t) * h + 3 * h * (f // t) + 2 * h
    with pytest.raises(InputError, match="TP degree 4 does not divide tiny-llama's 2 KV heads"):
        layer_shapes("tiny-llama", tp_degree=4)


def test_flops_are_two_per_weight_plus_attention():
    s = 2048
    block = layer_shapes("opt-1.3b", seq_len=s)[1]
    matmul = 4 * 2048 * 2048 + 2 * 2048 * 8192
    assert block.fwd_flops_per_token == pytest.approx(2 * matmul + 4 * (s / 2) * 2048)  # fused causal attention
    eager = layer_shapes("opt-1.3b", seq_len=s, regime="megatron-fp32-adamw")[1]
    assert eager.fwd_flops_per_token == pytest.approx(2 * matmul + 4 * s * 2048)


def test_activation_bytes_per_block_match_the_h200_memory_differences():
    """First-principles saved-tensor count vs peak-memory differences between 24 and 2 layers."""
    records = {
        (r["model"], r["layers"], r["mbs"]): r
        for r in map(json.loads, (MEASUREMENTS / "h200_opt_training.jsonl").read_text().splitlines()[1:])
    }
    for model, depth in (("opt-350m", 24), ("opt-1.3b", 24), ("opt-2.7b", 32)):
        for mbs in (1, 2):
            full, short = records[(model, depth, mbs)], records[(model, 2, mbs)]
            measured = (
                (full["peak_alloc_bytes"] - full["static_bytes"]) - (short["peak_alloc_bytes"] - short["static_bytes"])
            ) / (depth - 2)
            predicted = layer_shapes(model)[1].activation_bytes(mbs)
            assert predicted == pytest.approx(measured, rel=0.03), (model, mbs)


def test_eager_attention_keeps_the_quadratic_scores():
    flash = layer_shapes("opt-350m", seq_len=4096)[1].activation_bytes_per_seq
    eager = layer_shapes("opt-350m", seq_len=4096, regime="megatron-fp32-adamw")[1].activation_bytes_per_seq
    assert eager - 2 * flash > 16 * 4096 * 4096 * 4 * 0.9  # heads * s^2 fp32 probabilities


def test_last_index_sends_nothing_and_bad_tp_is_refused():
    assert layer_shapes("opt-350m")[-1].output_bytes(4) == 0
    assert layer_shapes("opt-350m")[0].output_bytes(2) == 2 * 2048 * 1024 * 4
    with pytest.raises(InputError, match="heads"):
        layer_shapes("opt-350m", tp_degree=3)



@pytest.mark.parametrize("seq,s_eff", [(4096, 4096), (2047, 2047 / 2)])
def test_a_window_shorter_than_the_sequence_costs_the_full_square(seq, s_eff):
    """Phi-3-mini's blocks attend to 2047 positions: at 4096 tokens the band-masked kernel skips no
    tiles (s per query); at 2047 they run as causal attention, whose fused kernel skips half."""
    h, f = 3072, 8192  # 32 heads of 96, MHA
    matmul = 4 * h * h + 3 * h * f
    block = layer_shapes("phi-3-mini", seq_len=seq, regime="torch-bf16-autocast-adamw")[1]
    assert block.fwd_flops_per_token == 2.0 * matmul + 4.0 * s_eff * h


def test_soft_capped_attention_is_eager_under_every_regime():
    """Gemma 2 at 4096 tokens: the engine's soft-capped attention is eager, local (window 4096) or not."""
    shapes = layer_shapes("gemma-2-2b", seq_len=4096, regime="torch-bf16-autocast-adamw")
    local, global_ = shapes[1], shapes[2]
    assert local.fwd_flops_per_token == global_.fwd_flops_per_token
    heads, s = 8, 4096
    assert local.activation_bytes_per_seq > heads * s * s * 2  # the probabilities are kept
