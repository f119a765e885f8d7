"""The default profile database: Sailor's shipped profiles plus the user's own, cached.

Apart from ``db`` (the database) and ``store`` (the files), so that writing the user's
profiles can reset the cache without the file format knowing about the database.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from sailor_core.profiles.db import ProfileDB, load_profile_db
from sailor_core.profiles.store import SHIPPED_DIR, profile_files, user_profiles_dir, write_profiles
from sailor_core.profiles.types import ModelProfile


@lru_cache(maxsize=1)
def default_profile_db() -> ProfileDB:
    """Sailor's published profiles and the H200 measurements (shipped with the package), then the
    user's own profiles (``$SAILOR_HOME/profiles`` or ``~/.sailor/profiles``), which win on equal keys."""
    return load_profile_db([*profile_files(SHIPPED_DIR), *profile_files(user_profiles_dir())])


def reset_default_profile_db() -> None:
    """Forget the cached default database (after new profiles were written)."""
    default_profile_db.cache_clear()


def write_user_profiles(name: str, profiles: Iterable[ModelProfile]) -> Path:
    """Write profiles as ``<user profiles dir>/<name>.parquet``, where the default database finds
    them; the cached default database is reset so the next ``default_profile_db()`` sees them."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("._") or "profiles"
    path = write_profiles(user_profiles_dir() / f"{safe}.parquet", profiles)
    reset_default_profile_db()
    return path
