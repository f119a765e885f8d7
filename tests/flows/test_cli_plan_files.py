"""From `sailor plan` to `sailor simulate`: a saved plan file, or what `plan --json` printed."""

from __future__ import annotations

import json

ARGS = ("plan", "--model", "tiny", "--gpus", "T4@us-central1-a=2", "--top", "2")


def test_plan_save_writes_a_plan_file_that_simulate_reads(sailor_cli, tmp_path):
    path = tmp_path / "best.json"
    r = sailor_cli(*ARGS, "--save", str(path))
    assert r.returncode == 0, r.stderr
    # The console wraps at 80 columns, inside the path when the temp directory's name is long.
    assert f"best plan written to {path}" in r.stdout.replace("\n", "")
    plan = json.loads(path.read_text())
    assert plan["model"] == "tiny" and plan["stages"]
    r = sailor_cli("simulate", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"] == plan


def test_simulate_takes_what_plan_json_printed_and_picks_a_rank(sailor_cli, tmp_path):
    r = sailor_cli(*ARGS, "--json")
    assert r.returncode == 0, r.stderr
    doc = tmp_path / "plans.json"
    doc.write_text(r.stdout)
    plans = json.loads(r.stdout)["plans"]
    for rank in range(1, len(plans) + 1):
        r = sailor_cli("simulate", str(doc), "--rank", str(rank), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plan"] == plans[rank - 1]["plan"]
    r = sailor_cli("simulate", str(doc), "--rank", str(len(plans) + 1))
    too_far = len(plans) + 1
    assert r.returncode == 2 and r.stderr.strip() == f"error: --rank {too_far}: the document has {len(plans)} plan(s)"


def test_older_option_spellings_still_work_hidden(sailor_cli):
    new = sailor_cli(*ARGS, "--global-batch-size", "16", "--max-usd-per-hr", "5", "--no-spot", "--json")
    old = sailor_cli(*ARGS, "--global-batch", "16", "--max-usd-per-hour", "5", "--on-demand", "--json")
    assert new.returncode == old.returncode == 0, new.stderr + old.stderr
    strip = lambda out: {k: v for k, v in json.loads(out).items() if k not in ("search_time_s",)}  # noqa: E731
    assert strip(new.stdout) == strip(old.stdout)
