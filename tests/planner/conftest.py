import pytest


@pytest.fixture(scope="session")
def profiles():
    from sailor_core.profiles import default_profile_db

    return default_profile_db()


@pytest.fixture(scope="session")
def network():
    from sailor_core.network.model import default_network

    return default_network()
