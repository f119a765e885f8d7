"""The engine's metrics where people read them: TensorBoard event files (read back with
tensorboard's own reader), W&B offline runs (read back with wandb's own record reader), MLflow's
file store (read back with its client), over a job resumed from a checkpoint by a second attempt."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

from sailor_core.plan.types import plan_from_dict
from sailor_core.runtime.launch import launch_local


STEP_TAGS = ("train/loss", "train/lr", "train/grad_norm", "train/grad_norm_clipped", "train/clipped",
             "perf/samples_per_s", "perf/tokens_per_s", "perf/model_flops_per_s", "perf/mfu_nominal",
             "memory/peak_bytes_rank0", "memory/peak_bytes_rank1")


def read_tensorboard(folder: Path):
    """Every scalar and text of ``folder``'s event files, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _two_attempts(corpus, tmp_path: Path, env: dict[str, str], more_flags: tuple[str, ...] = ()) -> Path:
    """Steps 1..4 (checkpoint at 2 and 4), then a second attempt from step 4 to 6."""
    # the embedded cloud's stand-in GPUs on this CPU: MFU is nominal, against the A100's peak
    plan = plan_from_dict({"model": "tiny", "global_batch_size": 8, "micro_batch_size": 2,
                           "stages": [{"layers": [a, b], "replicas": [{"gpu": "A100-40", "tp": 1}]}
                                      for a, b in ((0, 2), (2, 4))]})
    tb, ck = tmp_path / "tb", str(tmp_path / "ck")
    flags = ("--tensorboard-url", str(tb), "--job-id", "job-metrics-test", "--validate-every", "3",
             "--grad-clip-norm", "0.5", *more_flags)
    for attempt, steps in ((1, 4), (2, 6)):
        run = launch_local(plan, steps, data=corpus, ckpt_dir=ck, ckpt_every=2, resume=attempt > 1,
                           workdir=tmp_path / f"a{attempt}", timeout_s=240, worker_args=flags,
                           env={**env, "SAILOR_ATTEMPT": str(attempt)})
        assert run.status == "ok", run.message
    return tb


# two launches of two ranks, W&B's service and MLflow's store: ~70 s on 2 cores
@pytest.mark.slow
def test_metrics_reach_tensorboard_wandb_and_mlflow_on_one_step_axis(corpus, tmp_path, monkeypatch):
    mlflow_uri = f"file://{tmp_path / 'mlruns'}"
    # MLflow 3 keeps its file store behind this switch (a database is its default now)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_PROJECT": "sailor-test",
           "MLFLOW_TRACKING_URI": mlflow_uri, "MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_SILENT": "true"}
    tb = _two_attempts(corpus, tmp_path, env)
    _check_runs(tmp_path, tb, mlflow_uri)


# the same through the job's flags (`sailor train --wandb --mlflow`), no tracker variables but W&B's
# offline mode: ~70 s on 2 cores
@pytest.mark.slow
def test_the_tracker_flags_switch_wandb_and_mlflow_on(corpus, tmp_path, monkeypatch):
    mlflow_uri = f"file://{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"), "MLFLOW_ALLOW_FILE_STORE": "true",
           "WANDB_SILENT": "true"}
    tb = _two_attempts(corpus, tmp_path, env, ("--wandb", "sailor-test", "--mlflow", mlflow_uri))
    _check_runs(tmp_path, tb, mlflow_uri)


def _check_runs(tmp_path: Path, tb: Path, mlflow_uri: str) -> None:
    acc = read_tensorboard(tb)
    tags = acc.Tags()["scalars"]
    for tag in STEP_TAGS:
        assert [e.step for e in acc.Scalars(tag)] == [1, 2, 3, 4, 5, 6], tag  # one axis, each step once
    assert [e.step for e in acc.Scalars("val/loss")] == [3, 4, 6]  # every 3 and at each launch's last step
    val = acc.Scalars("val/loss")[-1].value
    assert acc.Scalars("val/perplexity")[-1].value == pytest.approx(math.exp(val), rel=1e-5)
    assert [(e.step, e.value) for e in acc.Scalars("events/attempt")] == [(0, 1), (4, 2)]
    assert "events/attempt" in tags
    lrs = [e.value for e in acc.Scalars("train/lr")]
    assert lrs[0] < lrs[1], "the warm-up shows"
    for raw, clipped in zip(acc.Scalars("train/grad_norm"), acc.Scalars("train/grad_norm_clipped")):
        assert clipped.value == pytest.approx(min(raw.value, 0.5), rel=1e-6)
    assert all(e.value > 0 for e in acc.Scalars("memory/peak_bytes_rank1"))

    _check_wandb(tmp_path / "wandb")
    _check_mlflow(mlflow_uri)


def wandb_records(path: Path):
    """The records of a W&B run file (``run-ID.wandb``): W&B's LevelDB-style log, 32 KiB blocks of
    chunks (crc32, length, type: full, first, middle, last) after a 7-byte header; wandb (0.31)
    reads it in its Go core only, so the few lines of its documented layout are here."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", raw[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pending += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def _check_wandb(folder: Path) -> None:
    runs = sorted(folder.glob("wandb/offline-run-*/run-job-metrics-test.wandb"))
    assert len(runs) == 2, "one offline run per attempt, both the job's run id"
    steps, attempts = [], []
    for path in runs:
        for rec in wandb_records(path):
            if rec.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item}
                steps.append(rec.history.step.num)
                if "events/attempt" in items:
                    attempts.append(int(float(items["events/attempt"])))
                assert "train/loss" in items and "train/grad_norm" in items
    assert steps == [1, 2, 3, 4, 5, 6]
    assert attempts == [1, 2]


def _check_mlflow(uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("sailor")
    (run,) = client.search_runs([exp.experiment_id], filter_string="tags.job_id = 'job-metrics-test'")
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "events/attempt")) == \
        [(0, 1.0), (4, 2.0)]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/perplexity")) == [3, 4, 6]


def test_the_flows_attempt_marks_read_back_as_their_own_run(tmp_path):
    from sailor_core.runtime.trackers import ATTEMPTS_RUN, write_attempt_events

    for attempt, step, spend in ((1, 0, 0.0), (2, 10, 0.001)):
        write_attempt_events(str(tmp_path), step=step, attempt=attempt, text=f"attempt {attempt}: 1 x T4",
                             scalars={"number": attempt, "spend_usd": spend, "preemptions": attempt - 1})
    acc = read_tensorboard(tmp_path / ATTEMPTS_RUN)
    assert [(e.step, e.value) for e in acc.Scalars("attempt/number")] == [(0, 1), (10, 2)]
    assert [e.value for e in acc.Scalars("attempt/preemptions")] == [0, 1]
    assert acc.Scalars("attempt/spend_usd")[-1].value == pytest.approx(0.001)
    texts = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors("attempt/plan")]
    assert texts == ["attempt 1: 1 x T4", "attempt 2: 1 x T4"]


def test_tensorboard_uploads_every_segment_and_leaves_no_local_copy(tmp_path, monkeypatch):
    import tempfile

    from sailor_core.runtime.trackers import Trackers

    for name in ("WANDB_PROJECT", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    trackers = Trackers(job_id=None, tensorboard_url=str(tmp_path / "tb"), attempt=1, config={},
                        wandb_project="", mlflow_uri="")
    trackers.started(0, plan_text="{}", state_from="scratch")
    trackers.log(1, {"train/loss": 2.5})
    trackers.flush()  # a checkpoint: the segment so far goes up, the next begins
    trackers.log(2, {"train/loss": 2.0})
    trackers.close()
    assert [e.value for e in read_tensorboard(tmp_path / "tb").Scalars("train/loss")] == [2.5, 2.0]
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2
    assert list((tmp_path / "scratch").iterdir()) == []  # nothing of the worker's left in the temp folder


def test_a_new_tensorboard_sink_removes_the_scratch_of_killed_workers_only(tmp_path, monkeypatch):
    # a SIGKILLed worker never reaches its close: the next worker to start on the machine sweeps
    import os
    import subprocess
    import tempfile

    from sailor_core.runtime.trackers import Trackers

    for name in ("WANDB_PROJECT", "WANDB_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = scratch / f"sailor-tb-{gone.pid}-k1ll3d"
    live = scratch / f"sailor-tb-{os.getpid()}-l1v3"
    unnamed = scratch / "sailor-tb-0ld_n4me"  # an older worker's name, without its pid: not ours to judge
    for folder in (dead, live, unnamed):
        (folder / "segment").mkdir(parents=True)
    trackers = Trackers(job_id=None, tensorboard_url=str(tmp_path / "tb"), attempt=1, config={},
                        wandb_project="", mlflow_uri="")
    assert not dead.exists()
    assert live.exists() and unnamed.exists()
    trackers.close()
    assert sorted(p.name for p in scratch.iterdir()) == sorted([live.name, unnamed.name])
