"""GPU types: memory, peak FLOP/s, memory and intra-node bandwidth."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from sailor_core.catalog._load import load_data_file
from sailor_core.errors import UnknownNameError


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    name: str
    memory_bytes: int
    peak_bf16_flops: float
    peak_fp32_flops: float
    memory_bw_bytes_per_s: float
    intra_node_bw_bytes_per_s: float
    intra_node_link: str
    gpus_per_node: tuple[int, ...]
    default_gpus_per_node: int

    @property
    def max_gpus_per_node(self) -> int:
        return max(self.gpus_per_node)


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, GPUSpec], dict[str, str]]:
    specs: dict[str, GPUSpec] = {}
    aliases: dict[str, str] = {}
    for row in load_data_file("gpus.json")["gpus"]:
        spec = GPUSpec(
            name=row["name"],
            memory_bytes=int(row["memory_bytes"]),
            peak_bf16_flops=float(row["peak_bf16_flops"]),
            peak_fp32_flops=float(row["peak_fp32_flops"]),
            memory_bw_bytes_per_s=float(row["memory_bw_bytes_per_s"]),
            intra_node_bw_bytes_per_s=float(row["intra_node_bw_bytes_per_s"]),
            intra_node_link=row["intra_node_link"],
            gpus_per_node=tuple(row["gpus_per_node"]),
            default_gpus_per_node=int(row["default_gpus_per_node"]),
        )
        specs[spec.name] = spec
        for alias in [spec.name, *row.get("aliases", [])]:
            aliases[alias.lower()] = spec.name
    return specs, aliases


def gpu_names() -> list[str]:
    return list(_catalog()[0])


def normalize_gpu_name(name: str) -> str:
    """Canonical GPU type name for any accepted spelling (case-insensitive)."""
    canonical = _catalog()[1].get(str(name).strip().lower())
    if canonical is None:
        raise UnknownNameError(
            f"unknown GPU type {name!r}; known: {', '.join(gpu_names())}"
        )
    return canonical


def get_gpu(name: str) -> GPUSpec:
    return _catalog()[0][normalize_gpu_name(name)]
