"""A sent tensor is freed once the schedule says it arrived, not at the step's end: gloo reports
a send complete only once waited, so without that the first stage kept every output it sent and
the second every input gradient, and a stage's peak memory grew with the micro-batches of the
step rather than with those in flight (``runtime/p2p.py``'s ``retire``)."""

import sys
from pathlib import Path

from .conftest import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_memory_inflight as inflight  # noqa: E402


def test_peak_memory_follows_the_microbatches_in_flight_not_those_of_the_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SAILOR_HOME", str(tmp_path / "home"))
    peaks = {}
    for num_mb in (4, 16):  # two stages: stage 0 holds 2 in flight, stage 1 one, either way
        plan = make_plan("tiny", [(0, 2, [1]), (2, 4, [1])], gbs=num_mb, mbs=1)
        peaks[num_mb] = inflight.measure(plan, 2, tmp_path / f"m{num_mb}")
    # each of the 12 micro-batches more held an output (stage 0) or an input gradient (stage 1)
    # of 1 x 64 x 64 fp32 = 16 KB until the step's end before; now none is left over
    assert set(peaks[4]) == set(peaks[16]) == {0, 1}
    for rank in (0, 1):
        assert abs(peaks[16][rank] - peaks[4][rank]) < 4096, (rank, peaks)
