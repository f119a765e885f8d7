"""Model architectures (decoder-only transformers) from the model catalog.

Each catalog model is one of the Hugging Face ``transformers`` families, with the
hyperparameters of its published ``config.json``: ``opt`` (``OPTForCausalLM``), ``gptneo``
(``GPTNeoForCausalLM``), and the Llama-style families (RMSNorm, RoPE, gated MLP, no learned
positions): ``llama``, ``qwen2``, ``qwen3``, ``mistral``, ``phi3``, ``gemma2`` and ``gemma3``.
What distinguishes those is a set of feature fields on ``ModelSpec`` (q/k/v biases, q/k norms,
head size, sliding windows, activation, Gemma's norms, scaling and soft-capping), so a family is
its config mapping (``catalog/hf_config.py``) and its weight names (``runtime/hf.py``).  The
engine builds exactly that model (``runtime/model.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import zlib
from functools import lru_cache

from sailor_core.catalog._load import load_data_file
from sailor_core.errors import InputError, UnknownNameError

# Llama-style families: one engine code path, told apart by ModelSpec's feature fields
ROPE_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3")
FAMILIES = ("opt", "gptneo", *ROPE_FAMILIES)
ATTENTION_KINDS = ("global", "local")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")  # of the gate of a Llama-style gated MLP


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """Llama 3's RoPE frequency scaling (``rope_type: "llama3"``): wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those
    shorter than ``.../ high_freq_factor`` kept, the ones between interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Architecture of a decoder-only model.

    Layer indices follow Sailor: 0 is the embedding, 1..num_layers the blocks,
    num_layers + 1 the final norm + LM head + loss.
    """

    name: str
    family: str  # one of FAMILIES
    num_layers: int
    hidden_size: int
    ffn_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    max_position_embeddings: int
    word_embed_proj_dim: int | None = None  # OPT-350m: embeddings of this width, projected in and out
    tie_embeddings: bool = False  # the LM head is the token embedding matrix
    pre_norm: bool = True  # OPT-350m: False (LayerNorm after each residual add, no final norm)
    norm_eps: float = 1e-5
    rope_theta: float = 500_000.0  # llama
    rope_scaling: RopeScaling | None = None  # llama 3.1+
    # gptneo: "global" or "local" per block (empty: all global); a local block attends to the
    # attention_window most recent positions, itself included
    attention_layers: tuple[str, ...] = ()
    attention_window: int = 0
    # the embedding's padding_idx (transformers: OPT's and Llama's pad_token_id): the input lookup
    # leaves that row's gradient at zero (a tied head still trains it)
    pad_token_id: int | None = None
    # the tokenizer's, as config.json gives them (they do not change the maths; an export writes
    # them back): eos may be several ids (Llama 3.1 Instruct's)
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    # ---- features of the Llama-style families (defaults: Llama's) ----
    head_size: int | None = None  # per-head width when not hidden_size / num_heads (Qwen3, Gemma)
    qkv_bias: bool = False  # Qwen2: biases on q/k/v
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm of each query and key head before RoPE
    mlp_activation: str = "silu"  # Gemma: "gelu_tanh" (gelu_pytorch_tanh)
    norm_unit_offset: bool = False  # Gemma: RMSNorm scales by (1 + weight); weights start at 0
    post_norms: bool = False  # Gemma 2/3: RMSNorm of the attention and MLP outputs before the residual add
    scale_embeddings: bool = False  # Gemma: embeddings times sqrt(hidden_size)
    query_pre_attn_scalar: int | None = None  # Gemma: scores scaled by this ** -0.5, not head_dim ** -0.5
    attn_logit_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    rope_local_theta: float | None = None  # Gemma 3: the RoPE theta of local (sliding) layers

    def __post_init__(self) -> None:
        object.__setattr__(self, "attention_layers", tuple(self.attention_layers))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.family not in FAMILIES:
            raise InputError(f"model {self.name}: family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.attention_layers and (len(self.attention_layers) != self.num_layers
                                      or set(self.attention_layers) - set(ATTENTION_KINDS)):
            raise InputError(f"model {self.name}: attention_layers must name global or local for each of its "
                             f"{self.num_layers} blocks")
        if self.mlp_activation not in MLP_ACTIVATIONS:
            raise InputError(f"model {self.name}: mlp_activation must be one of {', '.join(MLP_ACTIVATIONS)}")
        if "local" in self.attention_layers and self.attention_window < 1:
            raise InputError(f"model {self.name}: local attention layers need an attention_window")

    @property
    def num_layer_indices(self) -> int:
        return self.num_layers + 2

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def is_llama(self) -> bool:
        """A Llama-style model: RMSNorm, RoPE, gated MLP, no learned positions (ROPE_FAMILIES)."""
        return self.family in ROPE_FAMILIES

    @property
    def embedding_dim(self) -> int:
        """Width of the token embedding (and of the LM head's input)."""
        return self.word_embed_proj_dim or self.hidden_size

    def attention_kind(self, block: int) -> str:
        """``"global"`` or ``"local"`` for block ``block`` (1..num_layers)."""
        return self.attention_layers[block - 1] if self.attention_layers else "global"


def tp_split_problem(spec: ModelSpec, tp_degree: int) -> str | None:
    """Why TP degree ``tp_degree`` cannot split ``spec`` (None: it can).  The one rule the engine
    (``runtime/model.check_tp_degree``), plan validation, the planner, the simulator and the
    profiles all apply: heads, KV heads and the FFN split evenly (each rank holds whole heads and
    whole KV groups); the vocabulary is split unevenly in contiguous ranges
    (``runtime/tp.shard_range``: no padding), so it only needs a row for every rank."""
    if tp_degree < 1:
        return f"TP degree must be >= 1, got {tp_degree}"
    for what, n in (("attention heads", spec.num_heads), ("KV heads", spec.num_kv_heads),
                    ("FFN size", spec.ffn_size)):
        if n % tp_degree:
            return f"TP degree {tp_degree} does not divide {spec.name}'s {n} {what}"
    if spec.vocab_size < tp_degree:
        return f"TP degree {tp_degree} exceeds {spec.name}'s vocabulary of {spec.vocab_size} rows"
    return None


def _expand_attention_types(types: list) -> list[str]:
    """Hugging Face GPT-Neo's compact ``attention_types``, e.g. ``[[["global", "local"], 16]]``."""
    return [kind for pattern, repeat in types for _ in range(repeat) for kind in pattern]


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    specs: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    fields = set(ModelSpec.__dataclass_fields__)
    for row in load_data_file("models.json")["models"]:
        row = dict(row)
        if "attention_types" in row:
            row["attention_layers"] = _expand_attention_types(row.pop("attention_types"))
        spec = ModelSpec(**{k: v for k, v in row.items() if k in fields})
        specs[spec.name] = spec
        for alias in [spec.name, *row.get("aliases", [])]:
            aliases[alias.lower()] = spec.name
    return specs, aliases


def is_shipped_model(name: str) -> bool:
    """Whether ``name`` is one of the catalog's own entries (not a model registered in this process:
    a Hugging Face folder's, a test's), which every process knows without being told."""
    return name in _shipped_names()


@lru_cache(maxsize=1)
def _shipped_names() -> frozenset[str]:
    return frozenset(row["name"] for row in load_data_file("models.json")["models"])


def model_slug(name: str) -> str:
    """``name`` as a piece of a file name or job id: a catalog name as it is; a model folder's
    (a path or URL) its last component, lower-cased, with a hash of the whole name (two folders
    of the same name are two models)."""
    if "/" not in name:
        return name
    last = name.rstrip("/").rsplit("/", 1)[-1]
    safe = "".join(c if c.isalnum() or c == "." else "-" for c in last.lower()).strip("-.") or "model"
    return f"{safe}-{zlib.crc32(name.encode()):08x}"


def model_spec_to_dict(spec: ModelSpec) -> dict:
    """``spec`` as JSON (a plan file carries a model the catalog does not have)."""
    return dataclasses.asdict(spec)


def model_spec_from_dict(data: dict) -> ModelSpec:
    """The ModelSpec of ``model_spec_to_dict``'s output; InputError for anything else."""
    fields = set(ModelSpec.__dataclass_fields__)
    if not isinstance(data, dict) or set(data) - fields:
        raise InputError(f"a model spec takes the fields {', '.join(sorted(fields))}")
    try:
        return ModelSpec(**data)
    except TypeError as exc:
        raise InputError(f"a model spec: {exc}") from None


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
