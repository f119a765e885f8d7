"""``sailor profiles list | show | import``, in process: typer's runner on ``flows.cli.app.app``, and
``flows.cli.app.main`` (the ``sailor`` entry point) for the one-line errors."""

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from .conftest import MEASUREMENTS, SAILOR_DATA


def _app():
    import flows.cli.app

    flows.cli.app._register_all()
    return flows.cli.app.app


def _run(*args):
    return CliRunner().invoke(_app(), list(args))


def test_list_json_has_the_keys():
    out = _run("profiles", "list", "--json", "--gpu", "H200")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["profiles"]
    assert len(rows) == 12
    assert set(rows[0]) >= {"model", "gpu", "tp", "mbs", "seq", "source", "regime", "measured"}
    table = _run("profiles", "list", "--model", "OPT-30")
    assert table.exit_code == 0 and "32 profiles (tp: micro-batch sizes)" in table.stdout
    assert table.stdout.count("opt-30b") == 3  # one line per GPU: A100-40, GH-96, V100-16


def test_show_says_what_is_estimated():
    out = _run("profiles", "show", "--model", "opt-1.3b", "--gpu", "L4", "--mbs", "2", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["measured"] is False and data["source"].startswith("estimated")
    assert len(data["layers"]) == 26 and data["fwd_bwd_s"] > 0


def test_import_measurements_then_list(tmp_path):
    out = _run("profiles", "import", "--format", "measurements", str(MEASUREMENTS), "--name", "h200-again", "--json")
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["imported"] == 12 and Path(result["path"]).name == "h200-again.parquet"
    assert Path(result["path"]).parent == Path(os.environ["SAILOR_HOME"]) / "profiles"


def test_import_sailor_then_list():
    out = _run("profiles", "import", "--format", "sailor", str(SAILOR_DATA))
    assert out.exit_code == 0, out.output
    assert "imported 228 profiles" in " ".join(out.stdout.split())
    listed = _run("profiles", "list", "--json", "--model", "opt-30b")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["profiles"]
    assert {r["gpu"] for r in rows} == {"A100-40", "GH-96", "V100-16"}


def test_bad_input_is_one_line_and_non_zero(sailor_cli):
    user = Path(os.environ["SAILOR_HOME"]) / "profiles"

    def check(args, needle):
        r = sailor_cli(*args)
        code, err = r.returncode, r.stderr
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, code, err)

    check(["profiles", "import", "--format", "measurements", str(user / "nope.jsonl")], "nope.jsonl")
    check(["profiles", "import", "--format", "csv", str(user)], "unknown --format 'csv'")
    check(["profiles", "show", "--model", "opt-350m", "--gpu", "B300"], "unknown GPU type 'B300'")
    check(["profiles", "show", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "0"], "micro-batch size")
    user.mkdir(parents=True)
    (user / "corrupt.parquet").write_bytes(b"not parquet")
    from sailor_core.profiles import reset_default_profile_db

    reset_default_profile_db()  # as a new ``sailor`` process would start
    check(["profiles", "list"], "corrupt.parquet is not a readable profile file")
