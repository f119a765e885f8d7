"""Loaders on the real shared files, spot-checked against the READMEs' figures."""

import pytest

from sailor_core.errors import InputError
from sailor_core.traces import (
    MEASURED_BEHAVIOURS,
    detect_format,
    load_gpu_trace,
    load_trace,
    parse_probe_log,
    pool_statistics,
)

H = 3600.0
DATA = "bamboo/doc/data/"


def test_sailor_traces_rows_and_columns(sailor_configs):
    t = load_gpu_trace(sailor_configs / "gpu_trace_heterogeneous_imbalanced.csv")
    assert t.keys == (("A100-40", "us-central1-a"), ("V100-16", "us-central1-a"))
    assert [dict(c) for _, c in t.rows] == [
        {("A100-40", "us-central1-a"): 32, ("V100-16", "us-central1-a"): 96},
        {("A100-40", "us-central1-a"): 80, ("V100-16", "us-central1-a"): 240},
        {("A100-40", "us-central1-a"): 128, ("V100-16", "us-central1-a"): 384},
    ]
    assert t.rows[0][0] == 0.0 and t.start_epoch_s == pytest.approx(1712574014.0187)
    assert t.rows[2][0] == pytest.approx(1712574258.52282 - 1712574014.0187)
    multi = load_gpu_trace(sailor_configs / "gpu_trace_multizone.csv")
    assert len(multi.zones()) == 5 and multi.num_rows == 3
    one = load_gpu_trace(sailor_configs / "gpu_trace_2zones_2gpus.csv")
    assert one.num_rows == 1 and sum(one.row(0).values()) == 4 * 128


def test_sailor_trace_merges_identical_rows_and_normalises_names(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(",Timestamp,A100_us-central1-a,v100_us-central1-b\n0,100,4,8\n1,160,4,8\n2,220,2,8\n")
    t = load_gpu_trace(p)
    assert t.keys == (("A100-40", "us-central1-a"), ("V100-16", "us-central1-b"))
    assert [r[0] for r in t.rows] == [0.0, 120.0]
    assert [(e.time_s, e.num_gpus) for e in t.preemptions] == [(120.0, 2)]
    assert t.counts_at(119.9)[("A100-40", "us-central1-a")] == 4


@pytest.mark.parametrize(
    "text, words",
    [
        ("a,b\n1,2\n", "Timestamp"),
        (",Timestamp,H800_us-central1-a\n0,1,2\n", "unknown GPU type"),
        (",Timestamp,A100-40_mars-1a\n0,1,2\n", "unknown zone"),
        (",Timestamp,A100-40_us-central1-a\n0,1,-2\n", "whole number"),
        (",Timestamp,A100-40_us-central1-a\n0,5,2\n1,4,2\n", "back in time"),
        (",Timestamp,A100-40_us-central1-a\n", "no rows"),
        (",Timestamp,A100-40\n0,1,2\n", "<gpu>_<zone>"),
    ],
)
def test_sailor_trace_bad_input(tmp_path, text, words):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(InputError, match=words):
        load_gpu_trace(p)


def test_missing_file_is_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_trace(tmp_path / "nope.csv")


# (file, fmt, duration_h, events, nodes, largest, min, mean, max) from spot_traces/README.md 2.1
POOLS = [
    (DATA + "aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200.csv", "A", 24.50, 35, 85, 10, 0, 8.15, 12),
    (DATA + "aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv", "A", 88.70, 112, 178, 8, 0, 15.50, 16),
    (DATA + "aws-spot-instances-p2-xlarge-us-east-1e-2020-11-23-1700-to-2020-11-24-0700.csv", "A", 18.96, 3, 3, 1, 9, 9.99, 10),
    ("bamboo/traces/p3-trace.csv", "B", 11.37, 79, 167, 6, 10, 24.03, 32),
    ("bamboo/traces/gcloud/v100x1-east1c.txt", "C", 24.17, 55, 518, 40, 30, 76.33, 80),
    ("bamboo/traces/gcloud/a100x1-east1b.txt", "C", 27.02, 36, 154, 36, 17, 57.30, 64),
    ("oobleck/tools/simulator/traces/scaled/scale_p3-trace.csv", "B", 11.37, 70, None, 5, 15, 24.13, 30),
]


@pytest.mark.parametrize("rel, fmt, dur_h, events, nodes, largest, lo, mean, hi", POOLS)
def test_pool_statistics_match_readme(spot_dir, rel, fmt, dur_h, events, nodes, largest, lo, mean, hi):
    path = spot_dir / rel
    assert detect_format(path.read_text()) == fmt
    t = load_trace(path)
    assert len(t.keys) == 1
    s = pool_statistics(t, t.keys[0])
    assert s.duration_s / H == pytest.approx(dur_h, abs=0.01)
    assert s.num_preemption_events == events
    if nodes is not None:
        assert s.num_preempted == nodes
    assert s.largest_drop == largest
    assert (s.min_count, s.max_count) == (lo, hi)
    assert s.mean_count == pytest.approx(mean, abs=0.01)


def test_format_c_triplicated_rows_deduplicated(spot_dir):
    t = load_trace(spot_dir / "bamboo/traces/gcloud/v100x1-east1c.txt")
    assert any("three times" in n for n in t.notes)
    assert t.keys == (("V100-16", "us-east1-c"),)


def test_hours_file_counts_in_tick_drops(spot_dir):
    t = load_trace(spot_dir / DATA / "aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv")
    assert t.keys == (("T4", "us-east-1d"),)  # K80 -> T4, zone from Bamboo commit 947038d
    assert any("K80 mapped to T4" in n for n in t.notes)
    # 6 one-node drops recover within one 3.6 s tick: preemptions the counts cannot show.
    drops = sum(
        1 for (_, a), (t2, b) in zip(t.rows, t.rows[1:]) if b[t.keys[0]] < a[t.keys[0]]
    )
    assert len({e.time_s for e in t.preemptions}) == 112 > drops


def test_g4dn_event_trace_mean_from_first_event(spot_dir):
    t = load_trace(spot_dir / "bamboo/traces/g4dn-trace.csv")
    s = pool_statistics(t, t.keys[0], start_s=8 * 60)
    assert (s.num_preemption_events, s.num_preempted, s.min_count, s.max_count) == (48, 74, 1, 24)
    assert s.mean_count == pytest.approx(12.76, abs=0.01)


def test_oobleck_swaps_dropped_or_kept(spot_dir):
    from sailor_core.traces import load_node_events

    path = spot_dir / "oobleck/tools/simulator/traces/scaled/scale_gcp-trace.csv"
    dropped = load_node_events(path)
    kept = load_node_events(path, keep_synthetic_swaps=True)
    assert dropped.rows == kept.rows and dropped.keys == (("T4", "us-east-1a"),)
    assert len({e.time_s for e in dropped.preemptions}) == 39  # real drops
    assert len({e.time_s for e in kept.preemptions}) == 63     # + 24 synthetic swaps


@pytest.mark.parametrize(
    "rel, zone, gpu, per_vm, obtained, preemptions, uptime",
    [
        ("training_on_a_dime/logs/aws/availability/persistent_2020-03-15.out", "us-east-1c", "k80", 1, 24, 23, 0.819),
        ("training_on_a_dime/logs/aws/availability/persistent_2020-03-15.out", "us-east-1c", "k80", 8, 6, 6, 0.203),
        ("training_on_a_dime/logs/gcp/availability/persistent_2020-03-01.out", "us-east1-c", "nvidia-tesla-k80", 1, 103, 103, 0.640),
        ("training_on_a_dime/logs/gcp/availability/persistent_2020-03-01.out", "us-west1-b", "nvidia-tesla-v100", 1, 25, 24, 0.926),
        ("training_on_a_dime/logs/gcp/availability/persistent_2020-03-04.out", "us-east1-c", "nvidia-tesla-k80", 8, 16, 16, 0.807),
    ],
)
def test_probe_logs_match_readme(spot_dir, rel, zone, gpu, per_vm, obtained, preemptions, uptime):
    configs, window_s = parse_probe_log(spot_dir / rel)
    (cfg,) = [c for c in configs if (c.zone, c.gpu, c.gpus_per_vm) == (zone, gpu, per_vm)]
    assert (cfg.num_obtained, cfg.num_preemptions) == (obtained, preemptions)
    assert cfg.uptime_fraction(window_s) == pytest.approx(uptime, abs=0.002)


def test_probe_log_as_trace_sums_vm_sizes(spot_dir):
    t = load_trace(spot_dir / "training_on_a_dime/logs/aws/availability/persistent_2020-03-15.out")
    assert t.duration_s / H == pytest.approx(53.49, abs=0.01)
    # p3.2xlarge + p3.16xlarge in us-east-1b, both up 32 s after the start, never preempted.
    assert pool_statistics(t, ("V100-16", "us-east-1b"), start_s=60).min_count == 9
    assert sum(e.num_gpus for e in t.preemptions) == 3 * 8 + 23 * 1 + 6 * 8


def test_measured_behaviours_match_the_files(spot_dir):
    """The constants the generator cites are what the files give."""
    for b in MEASURED_BEHAVIOURS.values():
        t = load_trace(spot_dir / b.source)
        key = t.keys[0]
        start = 480.0 if "g4dn-trace" in b.source else 0.0
        s = pool_statistics(t, key, start_s=start)
        assert (s.duration_s / s.num_preemption_events) == pytest.approx(b.mtbp_s, rel=0.01)
        assert s.mean_bulk / s.max_count == pytest.approx(b.mean_bulk_fraction, rel=0.01)
        assert s.largest_drop / s.max_count == pytest.approx(b.largest_bulk_fraction)
        assert s.mean_count / s.max_count == pytest.approx(b.mean_available_fraction, abs=0.002)
