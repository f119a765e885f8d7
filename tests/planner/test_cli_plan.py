"""``sailor plan`` end to end: JSON keys, round trip through ``sailor simulate``, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sailor_core.source_data import SAILOR_CONFIGS_DIR

SAILOR = [sys.executable, "-m", "flows.cli.app"]
ROOT = Path(__file__).resolve().parents[2]
TRACES = SAILOR_CONFIGS_DIR


def _run(*args, check=True):
    out = subprocess.run([*SAILOR, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(out.stderr)
    return out


def test_plan_json_round_trips_through_simulate(tmp_path):
    out = _run("plan", "--model", "small", "--gpus", "A100-40@us-central1-a=4,V100-16@us-central1-b=4",
               "--global-batch", "64", "--top", "2", "--json")
    data = json.loads(out.stdout)
    assert data["search_time_s"] > 0
    assert 1 <= len(data["plans"]) <= 2
    for i, entry in enumerate(data["plans"]):
        for key in ("plan", "throughput_samples_per_s", "usd_per_iteration", "usd_per_hour", "peak_memory_bytes"):
            assert key in entry
        path = tmp_path / f"plan{i}.json"
        path.write_text(json.dumps(entry["plan"]))
        sim = json.loads(_run("simulate", str(path), "--json").stdout)
        for key in ("throughput_samples_per_s", "usd_per_iteration", "peak_memory_bytes"):
            assert sim[key] == pytest.approx(entry[key], rel=1e-12)
        assert sim["fits"] is True


def test_plan_from_trace_row_with_pareto_chart(tmp_path):
    png = tmp_path / "front.png"
    out = _run("plan", "--model", "opt-350m", "--trace", str(TRACES / "gpu_trace_scaled.csv"), "--row", "0",
               "--top", "1", "--pareto", str(png), "--json")
    data = json.loads(out.stdout)
    assert data["available"] == {"A100-40@us-central1-a": 32}
    assert sum(data["plans"][0]["gpus"].values()) <= 32
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data["pareto"]) >= 1


@pytest.mark.parametrize("args, needle", [
    (["--model", "nope", "--gpus", "A100-40@us-central1-a=4"], "unknown model"),
    (["--model", "small", "--gpus", "A100-40@us-central1-a=four"], "not an integer"),
    (["--model", "small", "--gpus", "A100-40@us-central1-a=4", "--objective", "speed"], "objective"),
    (["--model", "small", "--gpus", "A100-40@us-central1-a=4", "--max-usd-per-iter", "-1"], "positive"),
    (["--model", "small"], "exactly one of --gpus and --trace"),
    (["--model", "small", "--trace", str(TRACES / "gpu_trace_scaled.csv"), "--row", "9"], "out of range"),
    (["--model", "small", "--gpus", "A100-40@us-central1-a=4", "--global-batch", "64",
      "--min-throughput", "1e12", "--objective", "cost"], "above the best achievable"),
])
def test_bad_input_gives_one_error_line(args, needle):
    out = _run("plan", *args, check=False)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_plan_with_memory_levers_explains_them_and_simulate_agrees(tmp_path):
    # issue 34: llama-3-8b has no plan on 32 V100-16 without a lever; with the default it has one,
    # each stage's levers in the table, why in the notes, and the saved plan file carries them
    args = ("plan", "--model", "llama-3-8b", "--gpus", "V100-16@us-central1-a=32", "--global-batch", "64",
            "--top", "1")
    off = _run(*args, "--memory-levers", "off", check=False)
    assert off.returncode != 0 and "does not fit" in off.stderr
    path = tmp_path / "plan.json"
    out = _run(*args, "--save", str(path))
    assert "(recompute " in out.stdout and "memory: stage 0 " in out.stdout and "GB >" in out.stdout
    plan = json.loads(path.read_text())
    assert any("recompute" in s or "zero" in s for s in plan["stages"])
    sim = json.loads(_run("simulate", str(path), "--json").stdout)
    assert sim["fits"] is True
