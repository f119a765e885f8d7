"""Loading the network data shipped in ``data/`` (copied from eth-easl/sailor, MIT; see LICENSE-sailor-data.txt)."""

from __future__ import annotations

import json
from pathlib import Path

from sailor_core.network.fits import BandwidthFit
from sailor_core.settings import sailor_home

DATA_DIR = Path(__file__).parent / "data"


def _read(name: str) -> dict:
    with (DATA_DIR / name).open() as f:
        return json.load(f)


def load_inter_fits() -> dict[tuple[str, str, int, str, str, int], BandwidthFit]:
    return _inter_fits(_read("multizone_bandwidths_het.json"))


def user_network_dir() -> Path:
    """Where ``sailor profile network`` writes: $SAILOR_HOME/network or ~/.sailor/network."""
    return sailor_home() / "network"


def load_user_inter_fits() -> dict[tuple[str, str, int, str, str, int], BandwidthFit]:
    """Fits measured by the profiler (``sailor_core.profiler.network``), same nested layout under "fits"."""
    out = {}
    directory = user_network_dir()
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        with path.open() as f:
            out.update(_inter_fits(json.load(f).get("fits", {})))
    return out


def _inter_fits(tree: dict) -> dict[tuple[str, str, int, str, str, int], BandwidthFit]:
    out = {}
    for sz, by_gpu in tree.items():
        for sg, by_count in by_gpu.items():
            for sc, by_dst_zone in by_count.items():
                for dz, by_dst_gpu in by_dst_zone.items():
                    for dg, by_dst_count in by_dst_gpu.items():
                        for dc, entry in by_dst_count.items():
                            out[(sz, sg, int(sc), dz, dg, int(dc))] = BandwidthFit.from_json(entry)
    return out


def load_intra_fits() -> dict[tuple[str, int], BandwidthFit]:
    return {
        (gpu, int(count)): BandwidthFit.from_json(entry)
        for gpu, by_count in _read("intra_node_bandwidths.json").items()
        for count, entry in by_count.items()
    }


def load_egress_table() -> dict[tuple[str, str], float]:
    return {
        (src, dst): float(price)
        for src, row in _read("gcp_communication_cost.json").items()
        for dst, price in row.items()
    }
