"""Ctrl-C stops a job gracefully and a new process continues it from its last checkpoint (issue 32).

Every command runs as from a user's fresh shell on the embedded default: only PATH, HOME, SAILOR_HOME
(and the Prefect API of the tests' server) in its environment, no cloud started beforehand.  `sailor
train` (the embedded cloud inside its process; its buckets on disk under the Sailor home) trains 200
steps with a checkpoint every 10; SIGINT to its process group (a terminal's Ctrl-C) once the job passed
step 50.  The workers take a final checkpoint, the instances end, the flow run ends Cancelled in Prefect
with the job's reason, and the command prints the summary.  `sailor status` shows that checkpoint; a NEW
`sailor train --job-id J` (no --budget-usd: the job keeps its settings) resumes from it and reaches 200;
`sailor export` writes a folder transformers loads with the engine's logits.  The same with the
checkpoints in a ``gs://`` bucket of the embedded cloud.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.flows.conftest import ROOT, home_pids
from tests.flows.test_cancellation import _stop_group

import transformers  # noqa: E402  (the dev extra installs it: scripts/bootstrap)

JOB_ID = "stop-go"
STEPS, EVERY, STOP_AFTER = 200, 10, 50
TOL = 1e-5
GS_CHECKPOINTS = "gs://stop-go-checkpoints/runs/stop-go"


@pytest.fixture()
def home(tmp_path) -> Path:
    """A fresh user's Sailor home (under a fresh HOME)."""
    user = tmp_path / "user"
    (user / "work").mkdir(parents=True)
    return user / ".sailor"


def _fresh_shell(home: Path, api_url: str) -> dict[str, str]:
    """What a user's new shell holds: the `sailor` command on PATH, HOME, SAILOR_HOME; the Prefect API
    of the tests' server (a user's `sailor train` would start its own and find it again)."""
    sailor = shutil.which("sailor", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert sailor, "the `sailor` console script is installed next to the tests' python"
    return {"PATH": f"{Path(sailor).parent}{os.pathsep}/usr/bin:/bin", "HOME": str(home.parent),
            "SAILOR_HOME": str(home), "PREFECT_API_URL": api_url}


def _sailor(home, api_url, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["sailor", *args], env=_fresh_shell(home, api_url), cwd=str(home.parent / "work"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, **kw)


def _job(home) -> dict | None:
    try:
        return json.loads((home / "jobs" / JOB_ID / "state.json").read_text())
    except (OSError, ValueError):
        return None


def _lease(home) -> dict:
    return json.loads((home / "jobs" / JOB_ID / "lease.json").read_text())


def _flow_run(run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def _train_until_stopped(home, api_url, *extra: str, stop=lambda proc: os.killpg(proc.pid, signal.SIGINT)
                         ) -> tuple[int, str, str]:
    """`sailor train` of the job until it passes step 50, then ``stop(process)`` (default: a terminal's Ctrl-C)."""
    # A batch of 128 keeps the tiny model's steps slow enough that the stop lands before step 200.
    train = _sailor(home, api_url, "train", "--budget-usd", "0.5", "--steps", str(STEPS), "--checkpoint-every",
                    str(EVERY), "--global-batch", "128", "--val-fraction", "0", "--validate-every", "0",
                    "--job-id", JOB_ID, *extra)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert train.poll() is None, f"train exited early ({train.returncode}): {train.stderr.read()[-3000:]}"
            job = _job(home)
            if job and job["steps_done"] >= STOP_AFTER:
                break
            time.sleep(0.3)
        else:
            pytest.fail("the job did not pass step 50 within 400 s")
        stop(train)
        out, err = train.communicate(timeout=120)
    finally:
        _stop_group(train, signal.SIGKILL)
    return train.returncode, out.decode(), err.decode()


def _instances_left(home) -> set[int]:
    """The embedded instances' processes (agents, workers) of this Sailor home still alive."""
    return home_pids(home, (b"sailor_core.runtime",))


@pytest.mark.slow  # ~2 min each (5 on 2 busy cores): two flow runs, an export
@pytest.mark.parametrize("checkpoint_url", [None, GS_CHECKPOINTS], ids=["default", "gs"])
def test_ctrl_c_stops_with_a_final_checkpoint_and_a_new_process_continues_from_it(home, prefect_api, tmp_path,
                                                                                   checkpoint_url):
    # gs:// is reached by GCE instances' service account only: the CLI asks for --clouds gcp
    extra = ("--checkpoint-url", checkpoint_url, "--clouds", "gcp") if checkpoint_url else ()
    if checkpoint_url:  # a gs:// bucket must exist, as on GCP; the embedded cloud's buckets are its folders
        (home / "cloud" / "buckets" / checkpoint_url.split("/")[2]).mkdir(parents=True)
    code, out, err = _train_until_stopped(home, prefect_api, *extra)
    assert code == 130, (code, out[-3000:], err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in out + err, err[-3000:]
    assert "its workers take a final checkpoint" in out + err
    stopped = _job(home)
    ckpt = stopped["last_checkpoint_step"]
    assert stopped["status"] == "cancelled" and STOP_AFTER <= ckpt < STEPS, stopped["status_reason"]
    reason = (f"stopped by the user (Ctrl-C) at step {stopped['steps_done']}; checkpoint {ckpt} saved; "
              f"continue with `sailor train --job-id {JOB_ID}`")
    assert stopped["status_reason"] == reason
    assert ckpt == stopped["steps_done"], "the final checkpoint is of the step the workers stopped at"
    assert stopped["last_checkpoint"]["url"].endswith(f"step_{ckpt:08d}")
    assert stopped["spec"]["checkpoint_url"] == (checkpoint_url or f"s3://sailor-jobs/{JOB_ID}/checkpoints")
    assert reason in out, out[-3000:]  # the summary
    assert not _instances_left(home)
    assert _lease(home)["released"], "a graceful stop releases the job's lease: a continuation need not wait it out"
    run = _flow_run(stopped["flow_run_id"])
    assert run.state.type.value == "CANCELLED" and run.state.message == reason

    status = _sailor(home, prefect_api, "status", JOB_ID)
    status_out, status_err = (b.decode() for b in status.communicate(timeout=60))
    assert status.returncode == 0 and f"checkpoint {ckpt}" in status_out, (status_out, status_err[-3000:])

    again = _sailor(home, prefect_api, "train", "--job-id", JOB_ID)
    out2, err2 = (b.decode() for b in again.communicate(timeout=600))
    assert again.returncode == 0, (out2[-3000:], err2[-3000:])
    assert f"job {JOB_ID} continues with its own settings" in err2
    assert "waiting for the lease" not in out2 + err2
    assert f"{STEPS}/{STEPS}" in out2 and "/30 " not in out2, out2[-3000:]  # the bar's total is the job's
    done = _job(home)
    assert done["status"] == "succeeded" and done["steps_done"] == STEPS
    assert done["replans"][-1]["at_step"] == ckpt, "resumed from the checkpoint the stop saved"
    assert done["last_checkpoint_step"] == STEPS
    assert not _instances_left(home)

    export = _sailor(home, prefect_api, "export", JOB_ID, "--out", str(tmp_path / "export"), "--json")
    out3, err3 = export.communicate(timeout=300)
    assert export.returncode == 0, err3.decode()[-3000:]
    assert json.loads(out3)["step"] == STEPS
    _assert_logits_equal(_on_disk(home, done["spec"]["checkpoint_url"]), tmp_path / "export")


def _on_disk(home: Path, url: str) -> Path:
    """Where the embedded cloud keeps the objects under ``url`` (s3:// or gs://): its buckets are folders."""
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    folder = home / "cloud" / "buckets" / bucket / prefix
    assert folder.is_dir(), f"{url} is not on disk under {home}"
    return folder


def _assert_logits_equal(checkpoint_dir: Path, folder) -> None:
    from sailor_core.catalog.models import get_model
    from sailor_core.runtime.engine_run import final_params
    from sailor_core.runtime.model import StageModel
    from sailor_core.runtime.stage_checkpoint import load_full_weights

    _, params = final_params(str(checkpoint_dir))
    spec = get_model("tiny")
    engine = StageModel(spec, 0, spec.num_layer_indices)
    load_full_weights(engine, params, "test")
    exported = transformers.AutoModelForCausalLM.from_pretrained(folder).float().eval()
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert float((exported(input_ids=tokens).logits - engine(tokens)).abs().max()) <= TOL


@pytest.mark.slow  # ~30 s (1 min on 2 busy cores): a flow run
def test_a_cancel_of_the_flow_run_stops_it_with_a_final_checkpoint(home, prefect_api):
    """What a cancel in the Prefect UI does to the run's process (its worker SIGTERMs it; Prefect raises
    TerminationSignal in the flow), here to `sailor train`'s own: the workers checkpoint, the run ends Cancelled."""
    code, out, err = _train_until_stopped(home, prefect_api, stop=lambda proc: os.kill(proc.pid, signal.SIGTERM))
    assert code == 1 and "Traceback" not in err and "TerminationSignal" not in out + err, (code, err[-3000:])
    stopped = _job(home)
    ckpt = stopped["last_checkpoint_step"]
    reason = (f"stopped by the user (a cancel of its flow run: the Prefect UI or SIGTERM) at step "
              f"{stopped['steps_done']}; checkpoint {ckpt} saved; continue with `sailor train --job-id {JOB_ID}`")
    assert stopped["status"] == "cancelled" and stopped["status_reason"] == reason
    assert STOP_AFTER <= ckpt == stopped["steps_done"] < STEPS
    assert not _instances_left(home)
    assert _lease(home)["released"]
    run = _flow_run(stopped["flow_run_id"])
    assert run.state.type.value == "CANCELLED" and run.state.message == reason
