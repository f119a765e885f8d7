"""``sailor simulate / memory / catalog`` as a user runs them: real processes, real exit codes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def sailor(*args: str) -> subprocess.CompletedProcess:
    """The real ``sailor`` in its own process."""
    return subprocess.run([sys.executable, "-m", "flows.cli.app", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _plan_file(tmp_path, **changes) -> str:
    data = json.loads((EXAMPLES / "plan_tiny.json").read_text())
    data.update(changes)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_simulate_json_has_the_design_keys():
    out = sailor("simulate", str(EXAMPLES / "plan_opt350m.json"), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("iteration_time_s", "throughput_samples_per_s", "usd_per_iteration", "peak_memory_bytes",
                "fits", "breakdown", "stages"):
        assert key in data
    assert sum(data["breakdown"].values()) == pytest.approx(data["iteration_time_s"])
    assert len(data["stages"]) == 2 and data["stages"][0]["replicas"][1]["gpu"] == "V100-16"


def test_simulate_table():
    out = sailor("simulate", str(EXAMPLES / "plan_tiny.json"))
    assert out.returncode == 0, out.stderr
    assert "Iteration time" in out.stdout and "bubble" in out.stdout


def test_memory_json_and_growth_with_inflight(sailor_cli):
    sailor = sailor_cli
    one = sailor("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "2", "--inflight", "1",
                 "--layers", "0:13", "--json")
    four = sailor("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "2", "--inflight", "4",
                  "--layers", "0:13", "--json")
    assert one.returncode == 0 and four.returncode == 0, one.stderr + four.stderr
    a, b = json.loads(one.stdout), json.loads(four.stdout)
    assert b["peak_memory_bytes"] - a["peak_memory_bytes"] == 3 * a["activation_bytes"]
    assert a["loss_working_bytes"] == 0  # layers 0..12 do not hold the head
    parts = ("state_bytes", "activation_bytes", "loss_working_bytes", "comm_bytes", "optimizer_working_bytes",
             "backward_working_bytes", "overhead_bytes")
    assert sum(b[k] for k in parts) == b["peak_memory_bytes"]
    table = sailor("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "2", "--inflight", "4",
                   "--layers", "0:13")
    assert all(name in table.stdout for name in ("communication buffers", "optimizer step temporaries"))


def test_memory_lists_the_parts_with_and_without_each_lever(sailor_cli):
    # issue 34: one column per lever setting; the asked one first and in the JSON's top level
    out = sailor_cli("memory", "--model", "opt-2.7b", "--gpu", "V100-16", "--mbs", "1", "--inflight", "4",
                     "--layers", "0:17", "--dp", "4", "--recompute", "selective", "--zero", "1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    levers = data["levers"]
    assert set(levers) == {"recompute selective, ZeRO-1", "none", "ZeRO-1", "ZeRO-2", "recompute selective",
                           "recompute full"}
    assert data["peak_memory_bytes"] == levers["recompute selective, ZeRO-1"]["peak_memory_bytes"]
    none = levers["none"]
    assert levers["ZeRO-1"]["state_bytes"] < none["state_bytes"]
    assert levers["ZeRO-2"]["peak_memory_bytes"] <= levers["ZeRO-1"]["peak_memory_bytes"]
    assert levers["recompute full"]["activation_bytes"] < levers["recompute selective"]["activation_bytes"] < none["activation_bytes"]
    table = sailor_cli("memory", "--model", "opt-2.7b", "--gpu", "V100-16", "--mbs", "1", "--dp", "2")
    assert table.returncode == 0 and "recompute full" in table.stdout and "ZeRO-2" in table.stdout


def test_catalogs(sailor_cli):
    sailor = sailor_cli
    for what, key in (("gpus", "H200"), ("models", "opt-350m"), ("instances", "p5")):
        out = sailor("catalog", what, "--json")
        assert out.returncode == 0, out.stderr
        assert key in out.stdout


def _assert_one_line_error(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in out.stderr + out.stdout
    for w in words:
        assert w in lines[0]


@pytest.mark.parametrize(
    "args, words",
    [
        (("memory", "--model", "gpt-5", "--gpu", "A100-40", "--mbs", "1", "--inflight", "1"), ("unknown model",)),
        (("memory", "--model", "opt-350m", "--gpu", "B300", "--mbs", "1", "--inflight", "1"), ("unknown GPU",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "-2", "--inflight", "1"), ("--mbs",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--inflight", "0"), ("--inflight",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--inflight", "1",
          "--layers", "20:40"), ("layers",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--inflight", "1",
          "--layers", "x"), ("--layers",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--inflight", "1",
          "--tp", "3"), ("TP degree",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--recompute", "some"), ("--recompute",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--zero", "3"), ("--zero",)),
        (("memory", "--model", "opt-350m", "--gpu", "A100-40", "--mbs", "1", "--dp", "0"), ("--dp",)),
        (("catalog", "zones"), ("unknown catalog",)),
        (("simulate", "/nonexistent/plan.json"), ("cannot read",)),
    ],
)
def test_bad_input_gets_one_line(args, words, sailor_cli):
    _assert_one_line_error(sailor_cli(*args), *words)


def test_bad_plans_get_one_line(tmp_path, sailor_cli):
    run = sailor_cli
    _assert_one_line_error(run("simulate", _plan_file(tmp_path, model="gpt-5")), "unknown model")
    _assert_one_line_error(run("simulate", _plan_file(tmp_path, global_batch_size=-8)), "global_batch_size")
    stages = json.loads((EXAMPLES / "plan_tiny.json").read_text())["stages"]
    stages[1]["layers"] = [2, 3]
    _assert_one_line_error(run("simulate", _plan_file(tmp_path, stages=stages)), "not covered")
    stages[1]["layers"] = [2, 4]
    stages[1]["replicas"][0]["gpu"] = "B300"
    _assert_one_line_error(run("simulate", _plan_file(tmp_path, stages=stages)), "unknown GPU")


def test_corrupt_plan_file_in_a_real_process(tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"model": "tiny", "stages": [')
    _assert_one_line_error(sailor("simulate", str(corrupt)), "not valid JSON")


def test_memory_with_as_many_micro_batches_as_in_flight_is_the_simulators(sailor_cli):
    """A replica running one micro-batch per step (K = 1 of one) peaks where simulate says, not
    where a replica with more micro-batches than in flight does."""
    from sailor_core.plan.types import plan_from_dict
    from sailor_core.simulator import simulate

    rep = {"gpu": "A100-40", "tp": 1}
    plan = plan_from_dict({"model": "small", "global_batch_size": 2, "micro_batch_size": 2,
                           "stages": [{"layers": [0, 4], "replicas": [rep]}, {"layers": [4, 8], "replicas": [rep]}]})
    want = simulate(plan).stages[0].replicas[0].memory.peak_bytes
    args = ("memory", "--model", "small", "--gpu", "A100-40", "--mbs", "2", "--inflight", "1", "--layers", "0:4",
            "--json")
    one = json.loads(sailor_cli(*args, "--microbatches", "1").stdout)
    many = json.loads(sailor_cli(*args).stdout)
    assert one["peak_memory_bytes"] == want != many["peak_memory_bytes"]
    bad = sailor_cli("memory", "--model", "small", "--gpu", "A100-40", "--mbs", "2", "--inflight", "2",
                     "--microbatches", "1")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --microbatches must be at least --inflight (2) or 0, got 1"
