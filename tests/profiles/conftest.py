"""Every profiles test gets its own empty user profiles folder and a fresh default database."""

from pathlib import Path

import pytest

from sailor_core.source_data import MEASUREMENTS_DIR as MEASUREMENTS
from sailor_core.source_data import SAILOR_DATA_DIR as SAILOR_DATA


@pytest.fixture(autouse=True)
def _isolated_user_profiles(tmp_path, monkeypatch):
    from sailor_core.profiles import reset_default_profile_db

    monkeypatch.setenv("SAILOR_HOME", str(tmp_path / "sailor_home"))
    reset_default_profile_db()
    yield
    reset_default_profile_db()


@pytest.fixture(scope="session")
def sailor_profiles():
    from sailor_core.profiles.import_sailor import import_sailor

    return import_sailor(SAILOR_DATA)


@pytest.fixture(scope="session")
def h200_profiles():
    from sailor_core.profiles.import_measurements import import_measurements

    return import_measurements(MEASUREMENTS)
