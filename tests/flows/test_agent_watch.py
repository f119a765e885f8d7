"""The agent-watching loop both a training attempt and a network profile use (tasks/agent_watch)."""

from __future__ import annotations

import pytest

from sailor_core.job.protocol import AgentState, AgentStatus
from tasks import agent_watch
from tasks.agent_watch import AgentPoll, Listeners, Poll, watch_agents


class FakeSession:
    """Agents' statuses and the cloud's answers, counting how often the cloud is asked."""

    jobs_url = "memory://job"

    def __init__(self, statuses: dict[str, AgentStatus | None], boot_failures: dict[str, str] | None = None):
        self.statuses = statuses
        self.failures = boot_failures or {}
        self.cloud_asks: list[float] = []
        self.boot_asks: list[list[str]] = []

    def read_status(self, url: str, instance_id: str) -> AgentStatus | None:
        assert url == self.jobs_url
        return self.statuses[instance_id]

    def instance_states(self, ids):
        self.cloud_asks.append(agent_watch.time.monotonic())
        return {i: "running" for i in ids}

    def boot_failures(self, ids):
        self.boot_asks.append(list(ids))
        return {i: self.failures[i] for i in ids if i in self.failures}


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(agent_watch, "POLL_S", 0.01)
    monkeypatch.setattr(agent_watch, "CLOUD_POLL_S", 0.2)
    monkeypatch.setattr(agent_watch, "FAILURE_GRACE_S", 0.1)

    def use(session: FakeSession) -> FakeSession:
        monkeypatch.setattr(agent_watch, "read_status", session.read_status)
        return session

    return use


def _status(iid: str, state=AgentState.RUNNING) -> AgentStatus:
    return AgentStatus(instance_id=iid, generation=1, state=state)


def test_the_loop_ends_with_the_handlers_result_and_asks_the_cloud_on_its_timer(fast):
    session = fast(FakeSession({"a": _status("a"), "b": None}))
    polls: list[AgentPoll] = []

    def on_poll(poll: AgentPoll):
        polls.append(poll)
        return "done" if len(polls) == 5 else Poll.AGAIN

    assert watch_agents(session, ["a", "b"], on_poll) == "done"
    assert len(session.cloud_asks) == 1  # five polls of 10 ms inside one CLOUD_POLL_S
    assert session.boot_asks == [["b"]]  # only an instance whose agent has not reported may have failed its boot
    assert polls[-1].cloud_states == {"a": "running", "b": "running"}
    assert polls[-1].statuses["b"] is None and polls[-1].failing_for_s is None


def test_failed_workers_get_the_grace_with_the_cloud_asked_every_poll(fast):
    session = fast(FakeSession({"a": _status("a", AgentState.FAILED)}))
    seen: list[AgentPoll] = []

    def on_poll(poll: AgentPoll):
        seen.append(poll)
        return "blamed" if poll.failure_grace_over else Poll.WORKERS_FAILING

    assert watch_agents(session, ["a"], on_poll) == "blamed"
    assert seen[0].failing_for_s is None
    assert all(p.failing_for_s is not None for p in seen[1:])
    assert seen[-1].failing_for_s >= agent_watch.FAILURE_GRACE_S
    # every poll after the first failure asked the cloud, though CLOUD_POLL_S had not passed
    assert len(session.cloud_asks) == len(seen)


def test_a_failed_boot_reaches_the_handler(fast):
    session = fast(FakeSession({"a": None}, boot_failures={"a": "install failed"}))
    assert watch_agents(session, ["a"], lambda poll: dict(poll.boot_failures) or Poll.AGAIN) == {"a": "install failed"}


def test_listeners_are_told_until_removed():
    heard: list[int] = []
    listeners: Listeners[int] = Listeners()
    listeners.add(heard.append)
    listeners.emit(1)
    listeners.remove(heard.append)
    listeners.remove(heard.append)  # removing one not there is no error
    listeners.emit(2)
    assert heard == [1]
