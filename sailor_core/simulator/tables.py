"""Prefix sums over a profile's layers, so any stage [start, end) costs O(1) to sum.

The planner asks for thousands of stage ranges per second; summing per-layer
lists each time would dominate.  Tables are cached per profile object.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from sailor_core.profiles.types import ModelProfile


@dataclass(frozen=True, slots=True)
class LayerTable:
    profile: ModelProfile
    fwd_cum: tuple[float, ...]  # fwd_cum[i] = sum of fwd_s over layers [0, i)
    bwd_cum: tuple[float, ...]
    params_cum: tuple[int, ...]
    act_cum: tuple[int, ...]
    output_bytes: tuple[int, ...]
    all_measured_cum: tuple[int, ...]  # count of measured layers in [0, i)

    @property
    def num_layers(self) -> int:
        return len(self.output_bytes)

    def fwd_s(self, start: int, end: int) -> float:
        return self.fwd_cum[end] - self.fwd_cum[start]

    def bwd_s(self, start: int, end: int) -> float:
        return self.bwd_cum[end] - self.bwd_cum[start]

    def params(self, start: int, end: int) -> int:
        return self.params_cum[end] - self.params_cum[start]

    def activation_bytes(self, start: int, end: int) -> int:
        return self.act_cum[end] - self.act_cum[start]

    def measured(self, start: int, end: int) -> bool:
        return self.all_measured_cum[end] - self.all_measured_cum[start] == end - start


_CACHE: dict[int, LayerTable] = {}


def layer_table(profile: ModelProfile) -> LayerTable:
    """The (cached) prefix-sum table of ``profile``."""
    table = _CACHE.get(id(profile))
    if table is not None and table.profile is profile:
        return table
    layers = profile.layers
    table = LayerTable(
        profile,
        (0.0, *accumulate(layer.fwd_s for layer in layers)),
        (0.0, *accumulate(layer.bwd_s for layer in layers)),
        (0, *accumulate(layer.params for layer in layers)),
        (0, *accumulate(layer.activation_bytes for layer in layers)),
        tuple(layer.output_bytes for layer in layers),
        (0, *accumulate(int(layer.measured) for layer in layers)),
    )
    if len(_CACHE) > 4096:
        _CACHE.clear()
    _CACHE[id(profile)] = table  # the table holds the profile, so its id is not reused meanwhile
    return table
