"""A Hugging Face folder's weights checked without torch (``catalog/hf_weights.check_weights``):
every family's folder saved by transformers passes against its own config's model, and one of
another model's shapes does not."""

from __future__ import annotations

import pytest

from sailor_core.catalog.hf_config import resolve_model
from sailor_core.catalog.hf_weights import check_weights
from sailor_core.catalog.models import get_model
from sailor_core.errors import InputError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import transformers  # lazy: transformers and torch, the yardstick, only to save the folders

    from tests.hf_tiny import tiny_configs

    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, config in tiny_configs().items():
        out[name] = str(root / name)
        transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out[name])
    return out


def test_every_familys_folder_passes_against_its_own_model(saved):
    for name, folder in saved.items():
        check_weights(folder, get_model(resolve_model(folder)))


def test_a_folder_of_another_model_is_refused(saved):
    with pytest.raises(InputError, match="the weights have no tensor|has shape|parameters, not the"):
        check_weights(saved["qwen2"], get_model(resolve_model(saved["llama-3-like"])))
