"""A worker's own error reaches the user, bad input ends the job after one attempt, and the data
a job's workers would refuse is refused before anything is rented.

The worker writes ``{"event": "error", "rank", "message"}`` (any rank); the agent carries the
lowest rank's as ``AgentStatus.worker_error``; ``classify_attempt`` leads its reason with it;
``recovery`` fails the job at once on the engine's bad-input exit (2), never on 75/76/77;
``tasks.jobs.start_or_resume`` checks the job's data split as the workers make it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sailor_core import settings
from sailor_core.catalog.models import get_model
from sailor_core.controller import EventKind, PlanOption
from sailor_core.errors import InputError
from sailor_core.job import recovery
from sailor_core.job import state as js
from sailor_core.job.attempts import WORKER_FAILED, AttemptOutcome, classify_attempt
from sailor_core.job.protocol import (
    MAX_ERROR_CHARS,
    PROTOCOL_VERSION,
    AgentAction,
    AgentAssignment,
    AgentState,
    AgentStatus,
    ProtocolError,
    WorkerError,
    one_line,
    read_status,
    write_assignment,
    write_status,
)
from sailor_core.job.spec import JobSpec
from sailor_core.runtime.data import TokenDataset, generate_corpus
from sailor_core.job.protocol import EXIT_BAD_INPUT, EXIT_PEER_LOST, EXIT_PREEMPTED, EXIT_PREEMPTED_NO_CKPT
from tasks import jobs as job_tasks
from tests.flows.test_agent import _wait_status

OPTION = PlanOption(gpus={("T4", "us-east-1a"): 2}, throughput_samples_per_s=5.0, usd_per_hr=0.4,
                    label="2xT4@us-east-1a")
TOO_BIG = "data 'x.npy' holds 1023 samples of 65 tokens; holding out 1024 for validation leaves none to train on"


def _failed(iid: str, codes: dict[int, int], error: WorkerError | None = None) -> AgentStatus:
    return AgentStatus(instance_id=iid, generation=2, state=AgentState.FAILED, exit_codes=codes,
                       worker_error=error, heartbeat_unix_s=100.0)


def _classify(*statuses: AgentStatus):
    return classify_attempt(generation=2, statuses={st.instance_id: st for st in statuses},
                            cloud_states={st.instance_id: "running" for st in statuses}, now_unix_s=101.0)


# ---- the status field --------------------------------------------------------------------------


def test_the_worker_error_round_trips_and_a_status_without_it_still_reads(tmp_path: Path):
    job_url = str(tmp_path / "job")
    status = _failed("i-1", {0: 2, 1: 2}, WorkerError(rank=0, message=TOO_BIG))
    write_status(job_url, "i-1", status)
    assert read_status(job_url, "i-1") == status
    raw = json.loads((tmp_path / "job" / "agents" / "i-1" / "status.json").read_text())
    assert raw["worker_error"] == {"rank": 0, "message": TOO_BIG} and raw["version"] == PROTOCOL_VERSION
    # A document of an agent from before the field (same protocol version): read with no error.
    old = {k: v for k, v in raw.items() if k != "worker_error"}
    assert AgentStatus.from_dict(old).worker_error is None
    assert AgentStatus.from_dict({**raw, "worker_error": None}).worker_error is None


@pytest.mark.parametrize("bad, message", [
    ({"rank": 0}, "worker_error has no 'message'"),
    ({"rank": "0", "message": "m"}, "worker_error: rank = '0' is not valid"),
    ("oops", "agent status: worker_error = 'oops' is not valid"),
])
def test_a_malformed_worker_error_is_refused_naming_the_field(bad, message):
    with pytest.raises(ProtocolError, match=message):
        AgentStatus.from_dict({**_failed("i-1", {0: 2}).to_dict(), "worker_error": bad})


def test_an_error_message_is_carried_as_one_line_cut_to_length():
    assert one_line("\n  first line  \nTraceback ...") == "first line"
    long = one_line("x" * (MAX_ERROR_CHARS + 50))
    assert len(long) == MAX_ERROR_CHARS and long.endswith("...")
    assert one_line("") == ""


# ---- the attempt's outcome ------------------------------------------------------------------------


def test_a_bad_input_failure_says_the_workers_words_first_then_the_exit_codes():
    outcome = _classify(_failed("a", {0: 2, 1: 2}, WorkerError(rank=0, message=TOO_BIG)))
    assert outcome.kind == WORKER_FAILED and outcome.bad_input
    assert outcome.reason == f"worker failed on bad input: {TOO_BIG} (exit codes {{'a': {{'0': 2, '1': 2}}}})"
    assert outcome.exit_codes == {"a": {0: 2, 1: 2}}


def test_the_lowest_rank_s_error_wins_across_instances():
    # Instance "b" holds rank 0, which said why; instance "a" only a later rank's words.
    outcome = _classify(_failed("a", {2: 2, 3: 2}, WorkerError(rank=2, message="rank two's words")),
                        _failed("b", {0: 2, 1: 77}, WorkerError(rank=0, message="rank zero's words")))
    assert outcome.reason.startswith("worker failed on bad input: rank zero's words (exit codes ")
    assert outcome.instance_ids == ("a", "b")


def test_other_failures_keep_their_words_but_are_not_bad_input():
    outcome = _classify(_failed("a", {0: 77, 1: 77}, WorkerError(rank=1, message="checkpoint I/O: disk full")))
    assert not outcome.bad_input
    assert outcome.reason == "worker failed: checkpoint I/O: disk full (exit codes {'a': {'0': 77, '1': 77}})"
    # Without a message the reason is what it always was.
    silent = _classify(_failed("a", {0: 0, 1: 77}))
    assert silent.reason == "worker exited non-zero: {'a': {'0': 0, '1': 77}}" and not silent.bad_input


# ---- between attempts ---------------------------------------------------------------------------


def _job() -> js.JobState:
    return js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=20), job_id="j")


def _after(codes: dict[int, int], *, checkpoint_before: int | None = None, state: js.JobState | None = None,
           rec: recovery.Recovery | None = None) -> tuple[recovery.Recovery, AttemptOutcome]:
    state = state or _job()
    outcome = _classify(_failed("a", codes, WorkerError(rank=0, message=TOO_BIG)))
    rec = recovery.after_attempt(rec or recovery.start(state), state, outcome, ran=OPTION,
                                 checkpoint_before=checkpoint_before)
    return rec, outcome


def test_bad_input_ends_the_job_after_its_first_attempt_in_the_workers_words():
    rec, outcome = _after({0: EXIT_BAD_INPUT, 1: EXIT_PEER_LOST})
    assert rec.stalled and rec.num_without_progress == 1
    assert recovery.stalled_reason(rec, outcome) == outcome.reason
    assert recovery.stalled_reason(rec, outcome).startswith(f"worker failed on bad input: {TOO_BIG}")


@pytest.mark.parametrize("codes", [
    {0: EXIT_PEER_LOST, 1: EXIT_PEER_LOST},  # killed because a peer was preempted
    {0: EXIT_PREEMPTED, 1: EXIT_PEER_LOST},
    {0: EXIT_PREEMPTED_NO_CKPT},
    {0: 1},  # a crash: retried from the checkpoint
])
def test_other_exits_are_retried_until_three_attempts_make_no_progress(codes):
    rec = None
    for attempt in range(1, recovery.MAX_ATTEMPTS_WITHOUT_PROGRESS + 1):
        rec, outcome = _after(codes, rec=rec)
        assert rec.stalled == (attempt == recovery.MAX_ATTEMPTS_WITHOUT_PROGRESS), attempt
        assert rec.event.kind == EventKind.CAPACITY and not rec.bad_input
    assert recovery.stalled_reason(rec, outcome).startswith("3 attempts without a new checkpoint; last: worker")


def test_bad_input_after_a_new_checkpoint_is_retried():
    # The attempt trained on these inputs and saved; what failed later (a read of remote data) may pass.
    state = js.with_progress(_job(), last_checkpoint_step=5)
    rec, _ = _after({0: EXIT_BAD_INPUT}, state=state, checkpoint_before=None)
    assert not rec.stalled and rec.num_without_progress == 0
    rec, _ = _after({0: EXIT_BAD_INPUT}, state=state, checkpoint_before=5, rec=rec)  # and again, without progress
    assert rec.stalled


# ---- real agents and workers ----------------------------------------------------------------------


def _plan(num_ranks: int) -> dict:
    return {"model": "tiny", "global_batch_size": num_ranks, "micro_batch_size": 1,
            "stages": [{"layers": [0, 4], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local"}] * num_ranks}]}


def _small_corpus(tmp_path: Path) -> Path:
    # 130 tokens: 2 samples of 65; holding out one global batch of 3 leaves none to train on.
    return generate_corpus(tmp_path / "small.npy", vocab_size=get_model("tiny").vocab_size, num_tokens=130)


def test_agents_carry_the_lowest_rank_s_error_and_the_attempt_says_it(tmp_path: Path):
    """Two real agents, a world of 3 on data too small for the held-out batch: every rank refuses
    (exit 2) before the rendezvous; rank 0's words lead the attempt's reason, the other instance's
    agent has rank 2's."""
    data, job_url = _small_corpus(tmp_path), str(tmp_path / "job")
    expected = f"data {str(data)!r} holds 2 samples of 65 tokens; holding out 3 for validation leaves none to train on"
    ranks = {"i-a": (0, 1), "i-b": (2,)}
    agents = [subprocess.Popen([sys.executable, "-m", "sailor_core.runtime.agent", "--job-url", job_url,
                                "--instance-id", iid, "--work-dir", str(tmp_path / iid)],
                               env={**os.environ, settings.NOTICE_S_ENV: "1"}, start_new_session=True)
              for iid in ranks]
    try:
        for iid, mine in ranks.items():
            write_assignment(job_url, iid, AgentAssignment(
                generation=2, action=AgentAction.RUN, plan=_plan(3), ranks=mine, world_size=3,
                master_addr="127.0.0.1", master_port=29998, steps=3, data=str(data),
                ckpt_url=str(tmp_path / "ckpt"), ckpt_every=1))
        done = {iid: _wait_status(job_url, iid, lambda st: st.generation == 2 and st.state == AgentState.FAILED
                                  and len(st.exit_codes) == len(st.pids) and st.worker_error is not None)
                for iid in ranks}
        # Both of i-a's ranks wrote their line; the status carries rank 0's.
        lines = (Path(done["i-a"].log_dir) / "metrics.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["rank"] for line in lines) == [0, 1]
        assert done["i-a"].worker_error == WorkerError(rank=0, message=expected)
        assert done["i-a"].event.kind == "error" and done["i-a"].event.fields["rank"] == 0
        assert done["i-b"].worker_error == WorkerError(rank=2, message=expected)
        assert done["i-b"].exit_codes == {2: EXIT_BAD_INPUT} and done["i-b"].event is None  # not rank 0's
        outcome = classify_attempt(generation=2, statuses=done, cloud_states=dict.fromkeys(ranks, "running"),
                                   now_unix_s=max(st.heartbeat_unix_s for st in done.values()))
        assert outcome.bad_input and outcome.reason.startswith(f"worker failed on bad input: {expected} (exit codes")
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGTERM)
        for agent in agents:
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()


# ---- before anything is rented ---------------------------------------------------------------------


def test_a_job_whose_held_out_batch_leaves_nothing_to_train_on_is_refused_and_saved_failed(tmp_path: Path):
    store = js.JobStore(str(tmp_path / "jobs"))
    spec = JobSpec(model="tiny", budget_usd=0.05, steps=12, global_batch_size=1024, gpus=("T4",))
    with pytest.raises(InputError) as err:
        job_tasks.start_or_resume(store, spec, "big-batch", run_id="r1")
    assert str(err.value) == ("data 'synthetic' holds 1023 samples of 65 tokens; holding out 1024 for validation "
                              "leaves none to train on")
    saved = store.load("big-batch")
    assert saved.status == js.FAILED and saved.status_reason == str(err.value)
    assert saved.attempt == 0 and saved.instances == ()  # nothing planned or rented
    # The default batch fits the same corpus.
    ok = job_tasks.start_or_resume(store, JobSpec(model="tiny", budget_usd=0.05, steps=12), "small-batch")
    assert ok.status == store.load("small-batch").status != js.FAILED


def test_a_local_file_is_refused_in_the_workers_words(tmp_path: Path):
    data = _small_corpus(tmp_path)
    spec = JobSpec(model="tiny", budget_usd=0.05, dataset=str(data), global_batch_size=3)
    with pytest.raises(InputError) as preflight:
        job_tasks.check_data(spec)
    with pytest.raises(InputError) as worker:  # what the worker builds from the same settings
        TokenDataset(data, get_model("tiny").seq_len, validation_fraction=spec.validation_fraction,
                     min_val_samples=spec.global_batch_size)
    assert str(preflight.value) == str(worker.value)
    # No batch given (the planner picks one): refused when even a held-out batch of one leaves nothing.
    one_sample = generate_corpus(tmp_path / "one.npy", vocab_size=get_model("tiny").vocab_size, num_tokens=70)
    with pytest.raises(InputError, match="holds 1 samples of 65 tokens; holding out 1 for validation"):
        job_tasks.check_data(JobSpec(model="tiny", budget_usd=0.05, dataset=str(one_sample), global_batch_size=None))
    job_tasks.check_data(JobSpec(model="tiny", budget_usd=0.05, dataset=str(data), global_batch_size=None))
    # Object storage is the workers' to read: not looked at here.
    job_tasks.check_data(JobSpec(model="tiny", budget_usd=0.05, dataset="s3://nowhere/tokens.npy",
                                 global_batch_size=1024))


def test_a_manifest_whose_vocabulary_exceeds_the_model_s_is_refused_before_renting(tmp_path: Path):
    """`sailor data prepare`'s manifest names the tokenizer's vocabulary: past the model's, the job
    fails at its start (nothing planned or rented); within it, or without a manifest, it goes on."""
    import dataclasses

    from sailor_core.runtime.token_manifest import SourceFile, TokenManifest, manifest_path, write_manifest

    tiny_vocab = get_model("tiny").vocab_size
    data = generate_corpus(tmp_path / "tokens.npy", vocab_size=tiny_vocab, num_tokens=4096)
    store = js.JobStore(str(tmp_path / "jobs"))
    spec = JobSpec(model="tiny", budget_usd=0.05, steps=4, dataset=str(data))
    assert job_tasks.start_or_resume(store, spec, "no-manifest").status != js.FAILED

    def manifest(vocab_size: int) -> TokenManifest:
        return TokenManifest(tokenizer_path="/models/big/tokenizer.json", tokenizer_name="big", vocab_size=vocab_size,
                             eos_id=0, dtype="uint32", num_documents=1, num_tokens=4096,
                             sources=(SourceFile(path="/corpus.jsonl", num_bytes=1, sha256="0" * 64),))

    write_manifest(data, manifest(tiny_vocab))
    assert job_tasks.start_or_resume(store, spec, "fits").status != js.FAILED
    write_manifest(data, manifest(128_256))
    with pytest.raises(InputError) as err:
        job_tasks.start_or_resume(store, spec, "too-big")
    assert str(err.value) == (f"data {str(data)!r} was prepared with tokenizer 'big' of 128,256 ids; model 'tiny' "
                              f"has a vocabulary of {tiny_vocab:,} (token ids must be below it)")
    saved = store.load("too-big")
    assert saved.status == js.FAILED and saved.attempt == 0 and saved.instances == ()
    write_manifest(data, dataclasses.replace(manifest(tiny_vocab), num_tokens=4000))  # another file's
    with pytest.raises(InputError, match=r"describes 4,000 tokens, but .* holds 4,096: prepare the file again"):
        job_tasks.check_data(spec)
    manifest_path(data).write_text('{"tokenizer": {}}')
    with pytest.raises(InputError, match="token manifest .* is malformed"):
        job_tasks.check_data(spec)


def test_a_finished_job_is_not_checked_again(tmp_path: Path):
    store = js.JobStore(str(tmp_path / "jobs"))
    spec = JobSpec(model="tiny", budget_usd=0.05, steps=12, global_batch_size=1024)
    store.save(js.with_status(js.new_job(spec, "done"), js.SUCCEEDED, "12 steps done"))
    assert job_tasks.start_or_resume(store, spec, "done").status == js.SUCCEEDED


# A Prefect server for the flow run (the session's, when another test started it first): slow.
@pytest.mark.slow
@pytest.mark.e2e
def test_sailor_train_refuses_the_batch_in_one_line_before_renting(prefect_api, sailor_cli):
    r = sailor_cli("train", "--budget-usd", "0.05", "--steps", "12", "--global-batch-size", "1024", "--gpus", "T4",
                   "--max-gpus", "2", "--cloud", "embedded", "--job-id", "tiny-big-batch", "--json")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == InputError.exit_code and errors == [
        "error: data 'synthetic' holds 1023 samples of 65 tokens; holding out 1024 for validation leaves none to "
        "train on"], r.stderr
    state = js.JobStore().load("tiny-big-batch")
    assert state.status == js.FAILED and state.attempt == 0 and state.instances == ()
