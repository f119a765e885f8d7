"""Regenerate the profile data shipped with the package (``sailor_core/profiles/data/``).

    python -m sailor_core.profiles.build_shipped [SHARED_DIR]

SHARED_DIR holds ``sailor_data/`` and ``measurements/`` (default: ``../shared`` next to the repo).
Users never need this: the files it writes are part of the package.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sailor_core.profiles.import_measurements import import_measurements
from sailor_core.profiles.import_sailor import import_sailor
from sailor_core.profiles.store import SHIPPED_DIR, write_profiles

DEFAULT_SHARED = Path(__file__).resolve().parents[3] / "shared"


def build(shared: Path = DEFAULT_SHARED, out: Path = SHIPPED_DIR) -> dict[str, int]:
    sailor = import_sailor(shared / "sailor_data")
    h200 = import_measurements(shared / "measurements")
    write_profiles(out / "sailor.parquet", sailor)
    write_profiles(out / "measurements_h200.parquet", h200)
    return {"sailor.parquet": len(sailor), "measurements_h200.parquet": len(h200)}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    counts = build(Path(args[0]) if args else DEFAULT_SHARED)
    for name, n in counts.items():
        print(f"{SHIPPED_DIR / name}: {n} profiles")


if __name__ == "__main__":
    main()
