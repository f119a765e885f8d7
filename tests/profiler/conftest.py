"""Profiler tests: an isolated $SAILOR_HOME (profiles and network folders), fresh defaults; one
profile of ``tiny`` on CPU shared by the module's tests (profiling takes seconds)."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    from sailor_core.network.model import default_network
    from sailor_core.profiles import reset_default_profile_db

    monkeypatch.setenv("SAILOR_HOME", str(tmp_path / "sailor_home"))
    reset_default_profile_db()
    default_network.cache_clear()
    yield
    reset_default_profile_db()
    default_network.cache_clear()


@pytest.fixture(scope="session")
def tiny_run():
    """tiny on CPU, TP 1, micro-batch sizes 1 and 4: the profile the tests inspect."""
    from sailor_core.profiler.compute import profile_model
    from sailor_core.profiler.stats import Repetitions

    return profile_model("tiny", micro_batch_sizes=[1, 4], tp_degrees=[1], repeat=Repetitions(warmups=1, reps=5))
