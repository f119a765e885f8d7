"""Where the metrics rank 0 counts are read: TensorBoard event files in the job's storage, and
Weights & Biases and MLflow when their usual environment variables say so.

One axis for the whole job: every figure is logged at the job's step (``StageTrainer.step``
after the update), so a resumed or re-planned attempt continues the curves where the last
checkpoint left them.  Each attempt is marked at the step it starts from (``events/attempt``:
its number; the plan and where its state came from as text) and each stop on a notice at the
step it stopped (``events/preemption``).

- TensorBoard: a ``SummaryWriter`` writes to a local folder; at every checkpoint and when the
  worker stops, the file so far is closed and uploaded once to ``<job url>/tensorboard/``
  (``sailor_core/storage.py``) under a name that sorts by creation time, the order TensorBoard
  reads a folder's files in, and the next one begins.  The steps after the last checkpoint
  of a worker that dies are lost with it, as its training is: the next attempt redoes them.
  Its local folder (``sailor-tb-<pid>-*`` in the temp folder) is removed by the next worker
  to start a TensorBoard sink on that machine.  Each attempt's file starts with a ``SessionLog.START`` at its first new step:
  TensorBoard drops the steps after it that an earlier attempt logged past its last
  checkpoint (a peer lost mid-way), so each step shows once.
- Weights & Biases (``wandb``; on with ``--wandb PROJECT``, or when ``WANDB_PROJECT`` or
  ``WANDB_MODE`` is set, other than ``disabled``): the run id is the job id with ``resume="allow"``, so every attempt continues
  one run; the attempt markers go with the next step's figures (W&B takes steps in order).
- MLflow (``mlflow-skinny``; on with ``--mlflow URI`` or when ``MLFLOW_TRACKING_URI`` is set): the run tagged
  ``job_id`` in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``sailor``), found again by
  that tag on resume.
A tracker that fails to start or to log is reported once on stderr and left off: the
metrics never stop training.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sailor_core import settings
from sailor_core.storage import open_storage

MLFLOW_DEFAULT_EXPERIMENT = "sailor"
_SCRATCH = "sailor-tb-"  # a worker's local TensorBoard folders: sailor-tb-<pid>-<random>


class Trackers:
    """Rank 0's sinks of the job's metrics (each optional)."""

    def __init__(self, *, job_id: str | None, tensorboard_url: str | None, attempt: int, config: dict,
                 wandb_project: str = "", mlflow_uri: str = "") -> None:
        """``job_id``: the run every attempt continues (None: a new run, e.g. `sailor engine run`);
        ``wandb_project``/``mlflow_uri``: the job's `--wandb`/`--mlflow`, else their variables."""
        self.job_id, self.attempt = job_id, attempt
        self._tb = _TensorBoard(tensorboard_url, attempt) if tensorboard_url else None
        wandb_on = bool(wandb_project) or settings.wandb_enabled()
        self._wandb = _start("wandb", lambda: _WandB(job_id, config, wandb_project)) if wandb_on else None
        mlflow_uri = mlflow_uri or settings.mlflow_tracking_uri() or ""
        self._mlflow = _start("mlflow", lambda: _MLflow(job_id, config, mlflow_uri)) if mlflow_uri else None

    def _sinks(self) -> list:
        return [s for s in (self._tb, self._wandb, self._mlflow) if s is not None]

    def started(self, step: int, *, plan_text: str, state_from: str) -> None:
        """Mark the attempt beginning at ``step`` (the checkpoint's, 0 for a fresh job)."""
        text = f"attempt {self.attempt} from step {step} (state from {state_from}); plan: {plan_text}"
        for sink in self._sinks():
            _guard(sink, "start", step, self.attempt, text)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for sink in self._sinks():
            _guard(sink, "log", step, scalars)

    def preempted(self, step: int) -> None:
        for sink in self._sinks():
            _guard(sink, "preempted", step, self.attempt)

    def flush(self) -> None:
        if self._tb is not None:
            _guard(self._tb, "flush")

    def close(self) -> None:
        for sink in self._sinks():
            _guard(sink, "close")


def _start(name: str, make):
    try:
        return make()
    except Exception as exc:  # an optional tracker never stops training
        _warn(f"{name} not started: {type(exc).__name__}: {exc}")
        return None


def _guard(sink, method: str, *args) -> None:
    try:
        getattr(sink, method)(*args)
    except Exception as exc:
        _warn(f"{type(sink).__name__.strip('_')}.{method} failed, left off: {type(exc).__name__}: {exc}")
        sink.close = sink.log = sink.start = sink.preempted = sink.flush = lambda *a: None


def _warn(msg: str) -> None:
    sys.stderr.write(f"[sailor metrics] {msg}\n")
    sys.stderr.flush()


class _TensorBoard:
    """Segments of the event file: each flush closes the current one, uploads it once under a name
    that sorts by its creation, and opens the next (a job's upload stays linear in its steps)."""

    def __init__(self, url: str, attempt: int) -> None:
        _sweep_dead_scratch()
        self.local = Path(tempfile.mkdtemp(prefix=_scratch_prefix()))
        self.storage = open_storage(url.rstrip("/"))
        self.attempt = attempt
        self.writer = None
        self._open()

    def _open(self) -> None:
        # lazy: torch's writer needs the tensorboard package, only for a job that asked for it
        from torch.utils.tensorboard import SummaryWriter

        # sortable by creation: the order TensorBoard reads the files of a folder in
        self.name = f"events.out.tfevents.{time.time_ns():020d}.sailor-attempt{self.attempt}.pid{os.getpid()}"
        self.folder = Path(tempfile.mkdtemp(dir=self.local))
        self.writer = SummaryWriter(log_dir=str(self.folder), flush_secs=3600)
        self.dirty = False

    def start(self, step: int, attempt: int, text: str) -> None:
        # lazy: tensorboard's protos, with the writer above
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        # TensorBoard drops what it read at steps >= a START's: this attempt's first new step
        self.writer._get_file_writer().add_event(
            Event(step=step + 1, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))
        self.writer.add_scalar("events/attempt", attempt, step)
        self.writer.add_text("events/attempt", text, step)
        self.dirty = True

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.dirty = True

    def preempted(self, step: int, attempt: int) -> None:
        self.writer.add_scalar("events/preemption", attempt, step)
        self.writer.add_text("events/preemption", f"attempt {attempt} stopped at step {step} on a notice", step)
        self.dirty = True

    def flush(self, reopen: bool = True) -> None:
        if not self.dirty:
            return
        self.writer.close()
        (path,) = self.folder.glob("events.out.tfevents.*")
        self.storage.put(self.name, path.read_bytes())
        shutil.rmtree(self.folder, ignore_errors=True)
        if reopen:
            self._open()

    def close(self) -> None:
        self.flush(reopen=False)
        self.writer.close()
        # every segment is uploaded by now: a worker's local copy would only pile up in the temp folder
        shutil.rmtree(self.local, ignore_errors=True)


class _WandB:
    def __init__(self, job_id: str | None, config: dict, project: str) -> None:
        import wandb  # lazy: an optional extra (`pip install sailor[wandb]`)

        self.wandb = wandb
        self.run = wandb.init(id=job_id, name=job_id, resume="allow" if job_id else None, config=config,
                              project=project or os.environ.get("WANDB_PROJECT") or "sailor")
        self.pending: dict[str, float] = {}

    def start(self, step: int, attempt: int, text: str) -> None:
        self.pending["events/attempt"] = attempt
        self.run.summary[f"events/attempt_{attempt}"] = text

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({**scalars, **self.pending}, step=step)
        self.pending = {}

    def preempted(self, step: int, attempt: int) -> None:
        self.pending["events/preemption"] = attempt  # W&B takes steps in order: with the next attempt's

    def close(self) -> None:
        if self.pending:  # a preemption marker no later step carried: at the step it happened
            self.run.log(self.pending, step=self.run.step)
        self.run.finish()


class _MLflow:
    def __init__(self, job_id: str | None, config: dict, tracking_uri: str) -> None:
        from mlflow.tracking import MlflowClient  # lazy: an optional extra (`pip install sailor[mlflow]`)

        self.client = MlflowClient(tracking_uri=tracking_uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or MLFLOW_DEFAULT_EXPERIMENT
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
        runs = (self.client.search_runs([exp_id], filter_string=f"tags.job_id = '{job_id}'", max_results=1)
                if job_id else [])
        if runs:
            self.run_id = runs[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {"job_id": job_id} if job_id else {}
            self.run_id = self.client.create_run(exp_id, run_name=job_id, tags=tags).info.run_id
            for key, value in config.items():
                self.client.log_param(self.run_id, key, value)

    def _metrics(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric  # lazy: with the client above

        now_ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now_ms, step) for k, v in scalars.items()])

    def start(self, step: int, attempt: int, text: str) -> None:
        self._metrics(step, {"events/attempt": attempt})
        self.client.set_tag(self.run_id, f"attempt_{attempt}", text[:5000])

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._metrics(step, scalars)

    def preempted(self, step: int, attempt: int) -> None:
        self._metrics(step, {"events/preemption": attempt})

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED")


ATTEMPTS_RUN = "attempts"  # the flow's TensorBoard run beside the workers': <job url>/tensorboard/attempts


def _scratch_prefix() -> str:
    # the owner's pid in the name: a process killed before its close (SIGKILL) leaves its folder,
    # and the next one to start sees whose it was
    return f"{_SCRATCH}{os.getpid()}-"


def _sweep_dead_scratch() -> None:
    """Remove the scratch folders of processes that are gone (their un-uploaded steps died with
    them, as their training did).  Folders of live processes, and older ones named without a
    pid, stay."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_SCRATCH}*-*"):
        pid = folder.name[len(_SCRATCH):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def write_attempt_events(tensorboard_url: str, *, step: int, attempt: int, scalars: dict[str, float],
                         text: str) -> None:
    """The flow's record of one attempt (what the workers cannot know: the spend, the preemptions so
    far, the plan's price) as one event file at the step it starts from, in the run ``attempts``
    of the job's TensorBoard folder; tensorboard's own writer, without torch (the flow has none)."""
    # lazy: tensorboard's writer and protos, only where a job writes its curves
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.plugins.text.metadata import create_summary_metadata
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    values = [Summary.Value(tag=f"attempt/{k}", simple_value=float(v)) for k, v in scalars.items()]
    values.append(Summary.Value(tag="attempt/plan", metadata=create_summary_metadata("plan", ""),
                                tensor=TensorProto(dtype=7, string_val=[text.encode()])))  # 7: DT_STRING
    with tempfile.TemporaryDirectory(prefix=_scratch_prefix()) as folder:
        writer = EventFileWriter(folder)
        writer.add_event(Event(step=step, wall_time=time.time(), summary=Summary(value=values)))
        writer.close()
        (path,) = Path(folder).glob("*tfevents*")
        name = f"events.out.tfevents.{time.time_ns():020d}.sailor-attempt{attempt}.flow"
        open_storage(f"{tensorboard_url.rstrip('/')}/{ATTEMPTS_RUN}").put(name, path.read_bytes())
