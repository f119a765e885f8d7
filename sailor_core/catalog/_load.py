"""Reading the catalog data files that ship with the package."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"


@lru_cache(maxsize=None)
def load_data_file(name: str) -> dict:
    with (DATA_DIR / name).open() as f:
        return json.load(f)
