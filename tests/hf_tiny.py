"""Tiny random Hugging Face models of every family the engine supports, built by ``transformers``:
the yardsticks of the parity tests (``tests/runtime/test_hf_parity.py``) and of the families' end-to-end
flow test (``tests/flows/test_families_e2e.py``)."""

from __future__ import annotations

import torch

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)


def tiny_configs() -> dict:
    """{name: a small random transformers config}, in shapes the catalog entries lack."""
    t = transformers
    return {
        # opt-350m's shape: projection in and out, LayerNorm after each residual add, no final norm
        "opt-350m-like": t.OPTConfig(vocab_size=97, hidden_size=32, word_embed_proj_dim=16, ffn_dim=64,
                                     num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=16,
                                     do_layer_norm_before=False, dropout=0.0),
        "opt": t.OPTConfig(vocab_size=97, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=16, dropout=0.0),
        # local attention over a window shorter than the sequence
        "gpt-neo": t.GPTNeoConfig(vocab_size=101, hidden_size=32, num_layers=3, num_heads=4, max_position_embeddings=16,
                                  attention_types=[[["global", "local"], 1], [["local"], 1]], window_size=5),
        # Llama-3.2-1B's shape: tied, GQA, Llama 3 RoPE scaling (which changes some frequencies here)
        "llama-3.2-like": t.LlamaConfig(
            vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
        "llama-3-like": t.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-5,
                                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        # the Llama-style families, in shapes their catalog entries lack: GQA 3:1, untied heads, head
        # sizes other than hidden / heads, sliding windows shorter than the sequence
        "qwen2": t.Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                               tie_word_embeddings=False, use_sliding_window=True, sliding_window=5,
                               max_window_layers=1),
        "qwen2-tied": t.Qwen2Config(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                    tie_word_embeddings=True, rope_theta=1e6),
        "mistral": t.MistralConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=64, sliding_window=5),
        "qwen3": t.Qwen3Config(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                               tie_word_embeddings=True),
        "phi3": t.Phi3Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, sliding_window=5,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "gemma2": t.Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                                 sliding_window=5, query_pre_attn_scalar=10, attn_logit_softcapping=2.0,
                                 final_logit_softcapping=3.0),
        "gemma3": t.Gemma3TextConfig(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                     max_position_embeddings=64, sliding_window=5, sliding_window_pattern=2,
                                     rope_theta=1e6, rope_local_base_freq=1e4, tie_word_embeddings=False),
    }


def perturbed_model(config, *, seed: int):
    """``config``'s model in fp32 and eval mode, every parameter moved off its initial value (so
    biases and norms are not zeros and ones)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model
