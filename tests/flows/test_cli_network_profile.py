"""``sailor profile network --cloud ...``: bad input is one line and a non-zero exit, before anything
is rented; a run on the embedded cloud prints its table and leaves nothing running."""

from __future__ import annotations

import json

import pytest

from sailor_core.job import state as js


@pytest.mark.parametrize("args, expected", [
    (["--cloud", "embedded", "--zone", "us-central1-a"], "--gpu is required"),
    (["--cloud", "embedded", "--gpu", "T4"], "--zone is required"),
    (["--cloud", "embedded", "--gpu", "NOPE", "--zone", "us-central1-a"], "unknown GPU type 'NOPE'"),
    (["--cloud", "embedded", "--gpu", "T4", "--zone", "mars-1a"], "unknown zone 'mars-1a'"),
    (["--cloud", "embedded", "--gpu", "T4", "--zone", "local"], "zone 'local' is this machine's"),
    (["--cloud", "embedded", "--gpu", "T4", "--zone", "us-central1-a", "--workers", "1"], "--workers must be"),
    (["--cloud", "moon", "--gpu", "T4", "--zone", "us-central1-a"], "--cloud must be auto, embedded"),
    (["--gpu", "T4", "--zone", "us-central1-a"], "add --cloud"),
    (["--cloud", "embedded", "--gpu", "T4", "--zone", "us-central1-a", "--device", "tpu"], "--device must be"),
    (["--cloud", "embedded", "--gpu", "T4", "--zone", "us-central1-a", "--max-mib", "0"], "--max-mib must be"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(sailor_cli, args, expected):
    res = sailor_cli("profile", "network", *args)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], res.stderr
    assert "Traceback" not in res.stdout + res.stderr


def test_real_clouds_are_used_only_when_asked(sailor_cli, prefect_api, monkeypatch):
    monkeypatch.delenv("SAILOR_CLOUDS", raising=False)
    res = sailor_cli("profile", "network", "--cloud", "real", "--gpu", "T4", "--zone", "us-central1-a")
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "SAILOR_CLOUDS" in lines[0], res.stderr


def test_a_profile_that_could_cross_its_budget_is_refused_before_renting(sailor_cli, prefect_api):
    res = sailor_cli("profile", "network", "--cloud", "embedded", "--gpu", "H100-80", "--zone", "us-central1-a",
                     "--budget-usd", "0.5", "--json")
    assert res.returncode == 4, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "could cost up to" in lines[0] and "--budget-usd" in lines[0], res.stderr
    failed = [s for s in js.JobStore().list() if s.spec.model == "network-profile" and s.spec.gpus == ("H100-80",)]
    assert failed and failed[0].status == js.FAILED and not failed[0].instances


def test_a_cloud_run_prints_the_link_and_saves_it_when_asked(sailor_cli, prefect_api):
    res = sailor_cli("profile", "network", "--cloud", "local", "--gpu", "T4", "--zone", "us-central1-a",
                     "--dst-zone", "us-central1-b", "--max-mib", "1", "--reps", "2", "--save")
    assert res.returncode == 0, res.stderr
    assert "us-central1-a -> us-central1-b" in res.stdout and "n1-standard-4-t4x1" in res.stdout
    assert "0 left running" in res.stdout
    saved = next(line for line in res.stdout.splitlines() if line.startswith("saved to "))
    with open(saved.removeprefix("saved to ").strip()) as f:
        fits = json.load(f)["fits"]
    assert list(fits["us-central1-a"]["T4"]["1"]) == ["us-central1-b"]
