"""`sailor replay` bad input: one `error:` line, non-zero exit, no traceback."""

import pytest


@pytest.mark.parametrize(
    "args, words",
    [
        (["--trace", "/nonexistent.csv", "--model", "opt-350m", "--tokens", "1e9"], "does not exist"),
        (["--trace", "derived:gcp-4d", "--model", "no-such-model", "--tokens", "1e9"], "unknown model"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "-5"], "tokens"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--policy", "yolo"], "unknown policy"),
        (["--trace", "derived:nope", "--model", "opt-350m", "--tokens", "1e9"], "unknown derived trace"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--workers", "-1"], "--workers"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--objective", "speed"], "objective"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--rejoin-s", "-1"], "rejoin_s must be >= 0"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--deadline-h", "0"], "deadline"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--pareto", "x.png"], "--compare"),
        (["--trace", "derived:gcp-4d", "--model", "opt-350m", "--tokens", "1e9", "--on-demand-gpus", "-2"],
         "--on-demand-gpus must be at least 0"),
    ],
)
def test_bad_input_one_error_line(sailor_cli, args, words):
    p = sailor_cli("replay", *args)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_bad_trace_file(sailor_cli, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("hello,world\nfoo,bar\n")
    p = sailor_cli("replay", "--trace", str(bad), "--model", "opt-350m", "--tokens", "1e9")
    assert p.returncode != 0 and p.stderr.startswith("error:") and "trace format" in p.stderr


def test_json_and_plot(sailor_cli, tmp_path, monkeypatch):
    import json

    import sailor_core.replay.run as run_mod
    from tests.controller.planners import linear_planner

    monkeypatch.setattr(run_mod, "planner_plan_fn", lambda *_a, **_kw: linear_planner)  # real planner: slow test
    trace = tmp_path / "t.csv"
    trace.write_text(",Timestamp,A100-40_us-central1-a,V100-16_us-central1-b\n0,0,4,4\n1,3600,2,4\n2,7200,4,4\n")
    png = tmp_path / "timeline.png"
    p = sailor_cli("replay", "--trace", str(trace), "--model", "opt-350m", "--tokens", "2B", "--json",
                   "--plot", str(png), "--workers", "0")
    assert p.returncode in (0, None), p.stderr
    out = json.loads(p.stdout)
    assert set(out["policies"]) == {"ours", "skypilot", "single-type", "static"}
    for row in out["policies"].values():
        assert {"time_to_train_s", "usd_spent", "useful_work_fraction", "num_replans", "num_restarts"} <= set(row)
    assert out["policies"]["static"]["cost_ratio_to_ours"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in out["policies"].values():  # where the paid GPU time went; training's share is the useful one
        by = row["gpu_s_by_activity"]
        assert set(by) == {"training", "redone", "checkpointing", "provisioning", "starting", "other"}
        assert by["training"] / sum(by.values()) == pytest.approx(row["useful_work_fraction"])


def test_the_table_says_where_the_paid_gpu_time_went(sailor_cli, tmp_path, monkeypatch):
    import sailor_core.replay.run as run_mod
    from tests.controller.planners import linear_planner

    monkeypatch.setattr(run_mod, "planner_plan_fn", lambda *_a, **_kw: linear_planner)  # real planner: slow test
    trace = tmp_path / "t.csv"
    trace.write_text(",Timestamp,A100-40_us-central1-a,V100-16_us-central1-b\n0,0,4,4\n1,3600,2,4\n2,7200,4,4\n")
    p = sailor_cli("replay", "--trace", str(trace), "--model", "opt-350m", "--tokens", "2B", "--workers", "0")
    assert p.returncode in (0, None), p.stderr
    lines = [line.strip() for line in p.stdout.splitlines() if "the paid GPU time went to" in line]
    assert len(lines) == 4 and lines[0].startswith("ours: the paid GPU time went to training ")
    assert all("starting" in line for line in lines), lines
    # at 7200 s ours grows back onto new A100s: the GPUs it holds train while they boot (the
    # console may wrap the line)
    text = " ".join(p.stdout.split())
    ours = text[text.index("ours: the paid GPU time"):text.index("skypilot: the paid GPU time")]
    assert "; held GPUs trained while new instances booted in 1 of " in ours, ours


def test_compare_prints_the_front_and_the_equal_terms(sailor_cli, tmp_path, monkeypatch):
    import json

    import sailor_core.replay.run as run_mod
    from tests.controller.planners import linear_planner

    monkeypatch.setattr(run_mod, "planner_plan_fn", lambda *_a, **_kw: linear_planner)  # real planner: slow test
    trace = tmp_path / "t.csv"
    trace.write_text(",Timestamp,A100-40_us-central1-a,V100-16_us-central1-b\n0,0,4,4\n1,3600,2,4\n2,7200,4,4\n")
    png = tmp_path / "front.png"
    p = sailor_cli("replay", "--trace", str(trace), "--model", "opt-350m", "--tokens", "2B", "--json",
                   "--compare", "--pareto", str(png), "--workers", "0")
    assert p.returncode in (0, None), p.stderr
    c = json.loads(p.stdout)["comparison"]
    assert c["front"] and all(pt["policy"] == "ours" for pt in c["front"])
    assert {e["other"] for e in c["equal_terms"]} == {"skypilot", "single-type", "static"}
    assert c["summary"] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
