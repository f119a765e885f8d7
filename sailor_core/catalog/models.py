"""Model architectures (decoder-only transformers) from the model catalog."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog._load import load_data_file
from sailor_core.errors import UnknownNameError


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Architecture of a decoder-only model.

    Layer indices follow Sailor: 0 is the embedding, 1..num_layers the blocks,
    num_layers + 1 the final norm + LM head + loss.
    """

    name: str
    family: str  # "opt", "gptneo" or "llama"
    num_layers: int
    hidden_size: int
    ffn_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    max_position_embeddings: int
    word_embed_proj_dim: int | None = None
    tie_embeddings: bool = False
    pre_norm: bool = True

    @property
    def num_layer_indices(self) -> int:
        return self.num_layers + 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_llama(self) -> bool:
        return self.family == "llama"


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    specs: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    fields = set(ModelSpec.__dataclass_fields__)
    for row in load_data_file("models.json")["models"]:
        spec = ModelSpec(**{k: v for k, v in row.items() if k in fields})
        specs[spec.name] = spec
        for alias in [spec.name, *row.get("aliases", [])]:
            aliases[alias.lower()] = spec.name
    return specs, aliases


def model_names() -> list[str]:
    return list(_catalog()[0])


def register_model(spec: ModelSpec) -> None:
    """Add a model (e.g. a test model) to the in-process catalog."""
    specs, aliases = _catalog()
    specs[spec.name] = spec
    aliases[spec.name.lower()] = spec.name


def normalize_model_name(name: str) -> str:
    canonical = _catalog()[1].get(str(name).strip().lower())
    if canonical is None:
        raise UnknownNameError(f"unknown model {name!r}; known: {', '.join(model_names())}")
    return canonical


def get_model(name: str) -> ModelSpec:
    return _catalog()[0][normalize_model_name(name)]
