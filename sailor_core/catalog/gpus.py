"""GPU types: memory, peak FLOP/s, memory and intra-node bandwidth, TF32 support, CUDA device names.

Every fact about a GPU type lives in ``catalog/data/gpus.json``: adding a GPU is one row there
(plus its prices in ``instances.json`` if a cloud rents it).
"""

from __future__ import annotations

import re
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
    tf32: bool  # TF32 tensor cores: an fp32 framework's matmuls run on them
    cuda_names: tuple[str, ...]  # as torch.cuda.get_device_name reports them (see gpu_of_device_name)

    @property
    def max_gpus_per_node(self) -> int:
        return max(self.gpus_per_node)


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, GPUSpec], dict[str, str], dict[str, str]]:
    specs: dict[str, GPUSpec] = {}
    aliases: dict[str, str] = {}
    cuda_names: dict[str, str] = {}  # lower-cased CUDA device name -> GPU type
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
            tf32=bool(row["tf32"]),
            cuda_names=tuple(row["cuda_names"]),
        )
        specs[spec.name] = spec
        for alias in [spec.name, *row.get("aliases", [])]:
            aliases[alias.lower()] = spec.name
        for cuda_name in spec.cuda_names:
            other = cuda_names.setdefault(cuda_name.lower(), spec.name)
            if other != spec.name:
                raise ValueError(f"gpus.json: CUDA name {cuda_name!r} is listed for both {other} and {spec.name}")
    return specs, aliases, cuda_names


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


def gpu_of_device_name(device_name: str) -> str | None:
    """The GPU type of a CUDA device name (``NVIDIA H200`` -> ``H200``), or None if unknown.

    A known CUDA name that equals the device name wins (case-insensitive); else the longest known
    name the device name contains as whole words (``H200`` is not in ``NVIDIA GH200 480GB``,
    ``L4`` not in ``NVIDIA L40S``); a tie between two GPU types is unknown.
    """
    known = _catalog()[2]
    wanted = " ".join(str(device_name).split()).lower()
    if wanted in known:
        return known[wanted]
    contained = [name for name in known
                 if re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", wanted)]
    if not contained:
        return None
    longest = max(map(len, contained))
    types = {known[name] for name in contained if len(name) == longest}
    return types.pop() if len(types) == 1 else None
