"""The checkout's source data (``data/``) and the one command that rebuilds what ships from it.

    python -m sailor_core.source_data build [--out DIR]

An installed package never reads ``data/``: it reads the files built from it (profiles,
network fits), which ship inside the package.  Tests, benchmarks and this rebuild do read
it, and find it only through the names here.  See ``data/README.md``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from sailor_core.errors import InputError
from sailor_core.profiles.import_measurements import import_measurements
from sailor_core.profiles.import_sailor import import_sailor
from sailor_core.profiles.store import write_profiles

REPO_DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SAILOR_DATA_DIR = REPO_DATA_DIR / "sailor_data"
MEASUREMENTS_DIR = REPO_DATA_DIR / "measurements"
SPOT_TRACES_DIR = REPO_DATA_DIR / "spot_traces"
MEASUREMENTS_FILE = MEASUREMENTS_DIR / "h200_opt_training.jsonl"
SAILOR_CONFIGS_DIR = SAILOR_DATA_DIR / "simulations" / "configs"

_PROFILES_OUT = Path("sailor_core") / "profiles" / "data"
_NETWORK_OUT = Path("sailor_core") / "network" / "data"
# shipped network file -> its source under data/sailor_data (byte copies)
NETWORK_COPIES: dict[str, str] = {
    "multizone_bandwidths_het.json": "providers/multizone_bandwidths_het.json",
    "intra_node_bandwidths.json": "providers/intra_node_bandwidths.json",
    "gcp_communication_cost.json": "providers/gcp/communication_cost.json",
    "LICENSE-sailor-data.txt": "LICENSE",
}


def require(path: Path) -> Path:
    """``path`` if it exists, else a one-line error (an installed package has no ``data/``)."""
    if not path.exists():
        raise InputError(f"{path} is missing: the source data ships only with a checkout of the repository")
    return path


def build(out_root: Path = REPO_DATA_DIR.parent) -> dict[str, int]:
    """Rebuild the shipped profiles and network files under ``out_root`` (the repository by default).

    Returns the number of profiles or bytes written per file (relative to ``out_root``).
    """
    written: dict[str, int] = {}
    sailor = import_sailor(require(SAILOR_DATA_DIR))
    h200 = import_measurements(require(MEASUREMENTS_DIR))
    for name, profiles in (("sailor.parquet", sailor), ("measurements_h200.parquet", h200)):
        write_profiles(out_root / _PROFILES_OUT / name, profiles)
        written[str(_PROFILES_OUT / name)] = len(profiles)
    (out_root / _NETWORK_OUT).mkdir(parents=True, exist_ok=True)
    for name, source in NETWORK_COPIES.items():
        target = out_root / _NETWORK_OUT / name
        shutil.copyfile(require(SAILOR_DATA_DIR / source), target)
        written[str(_NETWORK_OUT / name)] = target.stat().st_size
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sailor_core.source_data",
                                     description="Rebuild the shipped profile and network files from data/.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="rebuild sailor_core/profiles/data and sailor_core/network/data")
    b.add_argument("--out", type=Path, default=REPO_DATA_DIR.parent,
                   help="root to write under (default: this repository)")
    args = parser.parse_args(argv)
    try:
        written = build(args.out)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, n in written.items():
        unit = "profiles" if name.endswith(".parquet") else "bytes"
        print(f"{args.out / name}: {n} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
