"""The profile database: per-layer time and memory of models on GPU types.

See ``docs/profiles.md``.  Import-light: pyarrow is loaded only when profile files are read
or written.
"""

from sailor_core.profiles.db import ProfileDB, load_profile_db
from sailor_core.profiles.default import default_profile_db, reset_default_profile_db, write_user_profiles
from sailor_core.profiles.types import LayerProfile, ModelProfile, ProfileKey

__all__ = [
    "LayerProfile",
    "ModelProfile",
    "ProfileDB",
    "ProfileKey",
    "default_profile_db",
    "load_profile_db",
    "reset_default_profile_db",
    "write_user_profiles",
]
