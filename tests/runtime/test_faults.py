"""The fault-injection hook: configured once from the environment, inert when nothing is configured."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sailor_core import settings
from sailor_core.errors import InputError
from sailor_core.runtime import faults
from sailor_core.runtime.faults import BEFORE_COMMIT, MID_STEP, UPLOAD, FaultConfig, Kill


def test_the_configuration_travels_to_workers_in_the_environment(monkeypatch):
    config = FaultConfig(kill=Kill(rank=1, step=3, point=BEFORE_COMMIT), upload_file="/tmp/x.json")
    env = config.to_env()
    assert env == {settings.FAULT_KILL_ENV: "1:3:save", settings.FAULT_UPLOAD_ENV: "/tmp/x.json"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert FaultConfig.from_env() == config
    monkeypatch.setenv(settings.FAULT_KILL_ENV, "0:2")
    assert FaultConfig.from_env().kill == Kill(rank=0, step=2, point=MID_STEP)
    assert FaultConfig().to_env() == {} and FaultConfig().empty


@pytest.mark.parametrize("text", ["1", "a:2", "1:2:later", "1:2:save:x"])
def test_a_malformed_kill_names_the_variable(monkeypatch, text):
    monkeypatch.setenv(settings.FAULT_KILL_ENV, text)
    with pytest.raises(InputError, match=settings.FAULT_KILL_ENV):
        FaultConfig.from_env()


def test_nothing_happens_without_a_configuration(tmp_path):
    with faults.injected(FaultConfig()):
        assert not faults.active()
        faults.at(MID_STEP, rank=0, step=1)
        faults.at(UPLOAD, path="step_00000001/layer_0000.pt")


def test_an_armed_upload_fault_is_taken_by_one_upload_only(tmp_path):
    path = tmp_path / "upload.json"
    with faults.injected(FaultConfig(upload_file=str(path))):
        assert faults.active()
        faults.at(UPLOAD, path="a")  # nothing armed yet
        faults.arm_upload(path, fail=True)
        with pytest.raises(OSError, match="injected"):
            faults.at(UPLOAD, path="b")
        faults.at(UPLOAD, path="c")  # taken: the next upload goes through
        assert not path.exists()
        faults.arm_upload(path, delay_s=0.0)
        faults.at(UPLOAD, path="d")  # a delay, no failure


def _hit(env: dict[str, str], point: str, rank: int, step: int) -> int:
    code = f"from sailor_core.runtime import faults; faults.at({point!r}, rank={rank}, step={step})"
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode


def test_a_kill_strikes_only_its_rank_step_and_point():
    env = {**os.environ, **FaultConfig(kill=Kill(rank=1, step=3)).to_env()}
    assert _hit(env, MID_STEP, 1, 3) == -signal.SIGKILL
    assert _hit(env, MID_STEP, 0, 3) == 0
    assert _hit(env, MID_STEP, 1, 2) == 0
    assert _hit(env, BEFORE_COMMIT, 1, 3) == 0
