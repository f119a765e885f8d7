from pathlib import Path

import pytest

from sailor_core.source_data import SAILOR_CONFIGS_DIR as SAILOR_CONFIGS
from sailor_core.source_data import SPOT_TRACES_DIR as SPOT


@pytest.fixture(scope="session")
def spot_dir() -> Path:
    if not SPOT.is_dir():
        pytest.fail(f"spot traces missing at {SPOT} (data/ of the repository)")
    return SPOT


@pytest.fixture(scope="session")
def sailor_configs() -> Path:
    if not SAILOR_CONFIGS.is_dir():
        pytest.fail(f"Sailor configs missing at {SAILOR_CONFIGS} (data/ of the repository)")
    return SAILOR_CONFIGS
