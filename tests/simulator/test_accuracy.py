"""The simulator against the real H200 runs in data/measurements (the benchmark's targets)."""

import sys
from pathlib import Path

import pytest

from sailor_core.source_data import MEASUREMENTS_FILE

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = MEASUREMENTS_FILE


@pytest.fixture(scope="module")
def summary():
    if not MEASUREMENTS.is_file():
        pytest.fail(f"measurements missing at {MEASUREMENTS} (data/ of the repository)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_simulator_accuracy as bench
    finally:
        sys.path.pop(0)
    return bench.evaluate(MEASUREMENTS)


def test_iteration_time_within_targets(summary):
    s = summary["summary"]
    assert s["kept"] >= 9
    assert s["time_error_median"] <= 0.03
    assert s["time_error_max"] <= 0.08


def test_peak_memory_within_targets_from_profiles_and_from_first_principles(summary):
    s = summary["summary"]
    assert s["memory_error_median"] <= 0.03 and s["memory_error_max"] <= 0.08
    # with no H200 profile at all, the analytic activation sizes must answer as well
    assert s["held_out_memory_error_median"] <= 0.03 and s["held_out_memory_error_max"] <= 0.08


def test_left_out_records_are_only_the_noisy_ones(summary):
    for row in summary["rows"]:
        assert row["left_out"] == (row["spread"] > 0.10)
