"""``sailor profile`` bad input: one ``error:`` line, non-zero exit, no traceback."""

import pytest


@pytest.mark.parametrize("args, words", [
    (("profile", "--model", "nope"), "unknown model"),
    (("profile",), "--model is required"),
    (("profile", "--model", "tiny", "--mbs", "0"), "--mbs"),
    (("profile", "--model", "tiny", "--mbs", "a,b"), "--mbs"),
    (("profile", "--model", "tiny", "--tp", "3"), "TP degree 3"),
    (("profile", "--model", "tiny", "--device", "tpu"), "device"),
    (("profile", "--model", "tiny", "--timer", "cpu", "--device", "cuda"), "timer"),
    (("profile", "network", "--workers", "1"), "--workers"),
    (("profile", "network", "--reps", "0"), "--reps"),
])
def test_bad_input_is_one_error_line(sailor_cli, args, words):
    res = sailor_cli(*args)
    assert res.returncode != 0
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout


@pytest.mark.slow  # ~10 s of profiling on a loaded 2-core machine; the same code runs in test_compute_profile
def test_profile_json_output_saves_and_reports(sailor_cli, tmp_path):
    import json

    res = sailor_cli("profile", "--model", "tiny", "--mbs", "1", "--reps", "1", "--no-overhead", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    (p,) = out["profiles"]
    assert p["model"] == "tiny" and p["gpu"] == "cpu" and len(p["layers"]) == 4
    assert out["saved_to"].endswith("profiled-tiny-cpu.parquet")
    assert all(layer["fwd"]["num_samples"] == 1 for layer in p["detail"]["layers"])
