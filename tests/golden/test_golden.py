"""The code computes what it computed when ``tests/golden/data`` was recorded, bit for bit
(``benchmarks/golden.py``: the planner on the benchmark scenarios and the optimality cases,
``simulate`` on example, hand-written and planned plans, ``sailor memory``'s figures, replays).

The default run checks a quick subset (a few planner scenarios and optimality cases, every
simulated plan, every memory case, one replay); ``-m slow`` checks everything.  After an
intended change of results, re-record with ``.venv/bin/python benchmarks/golden.py record``."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import golden  # noqa: E402


@pytest.fixture(autouse=True)
def _shipped_data_only(tmp_path):
    """The goldens were recorded from the shipped profiles and network alone: hide the profiles
    and links other tests of the session measured and saved under their SAILOR_HOME."""
    from sailor_core.network.model import default_network
    from sailor_core.profiles import reset_default_profile_db

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAILOR_HOME", str(tmp_path / "sailor_home"))
        default_network.cache_clear()
        reset_default_profile_db()
        yield
    default_network.cache_clear()
    reset_default_profile_db()


def _check(**kwargs) -> None:
    lines: list[str] = []
    ok = golden.check(out=lines.append, **kwargs)
    shown = lines if len(lines) <= 60 else [*lines[:60], f"... {len(lines) - 60} more lines"]
    assert ok, "results differ from the golden files:\n" + "\n".join(shown)


def test_quick_subset_matches_the_golden_files():
    _check(quick=True)


@pytest.mark.slow
def test_everything_matches_the_golden_files():
    _check()


def test_compare_is_bit_for_bit():
    x = 0.1 + 0.2
    assert golden.compare({"a": [x, 1, None, "s"]}, {"a": [x, 1, None, "s"]}) == []
    assert golden.compare(float("nan"), float("nan")) == []
    one_ulp = golden.compare({"a": [x]}, {"a": [x * (1 + 2**-52)]})
    assert len(one_ulp) == 1 and one_ulp[0].startswith("/a/0: golden 0.30000000000000004")
    assert golden.compare(0.0, -0.0)  # the sign of zero counts
    assert golden.compare(1, 1.0) and golden.compare(True, 1)  # so does the type
    assert golden.compare({"a": 1}, {"a": 1, "b": 2}) == ["/b: not in golden (now 2)"]
    assert golden.compare({"a": 1, "b": 2}, {"a": 1}) == ["/b: missing now (golden 2)"]
    assert golden.compare([1, 2], [1, 2, 3]) == [": golden has 2 items, now 3"]


def test_golden_floats_survive_the_round_trip():
    # What record stores is what check reads: JSON keeps the shortest repr, which reads back exactly.
    values = [0.1, 1 / 3, 2.5769803776000013, 5e-324, 1.7976931348623157e308, -0.0, float("inf")]
    assert [v.hex() for v in golden._canon(values)] == [v.hex() for v in values]
