import sys
from pathlib import Path

import pytest

# --import-mode=importlib puts no test directory on sys.path; the tests share replay_helpers.
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
SPOT = SHARED / "spot_traces"
SAILOR_CONFIGS = SHARED / "sailor_data" / "simulations" / "configs"


@pytest.fixture(scope="session")
def spot_dir() -> Path:
    if not SPOT.is_dir():
        pytest.fail(f"shared spot traces missing at {SPOT}")
    return SPOT


@pytest.fixture(scope="session")
def sailor_configs() -> Path:
    if not SAILOR_CONFIGS.is_dir():
        pytest.fail(f"shared Sailor configs missing at {SAILOR_CONFIGS}")
    return SAILOR_CONFIGS
