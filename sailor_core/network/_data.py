"""Loading the network data shipped in ``data/`` (copied from eth-easl/sailor, MIT; see LICENSE-sailor-data.txt)."""

from __future__ import annotations

import json
from pathlib import Path

from sailor_core.network.fits import BandwidthFit

DATA_DIR = Path(__file__).parent / "data"


def _read(name: str) -> dict:
    with (DATA_DIR / name).open() as f:
        return json.load(f)


def load_inter_fits() -> dict[tuple[str, str, int, str, str, int], BandwidthFit]:
    out = {}
    for sz, by_gpu in _read("multizone_bandwidths_het.json").items():
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
