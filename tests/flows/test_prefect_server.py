"""The local Prefect server: one per SAILOR_HOME however many commands start at once, the
Prefect profile that points plain `prefect` commands at it, and a stop that leaves nothing.

A stand-in server (a stdlib HTTP server that answers /api/health after a second) keeps the
start race fast to test; the profile is written by Prefect's own code, as in `sailor ui`.
"""

from __future__ import annotations

import sys
import threading
import tomllib

import pytest

from flows.cli import background, prefect_server

FAKE_SERVER = """
import http.server, sys, time
time.sleep(1.0)  # a server that takes a while to answer: the window the lock closes
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture()
def homes(tmp_path, monkeypatch):
    monkeypatch.setenv("SAILOR_HOME", str(tmp_path / "sailor"))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    for k in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH", "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL",
              "PREFECT_SERVER_ANALYTICS_ENABLED"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def test_commands_started_at_once_share_one_server_and_stop_stops_it(homes, monkeypatch):
    starts = []
    monkeypatch.setattr(prefect_server, "server_command",
                        lambda port: starts.append(port) or [sys.executable, "-c", FAKE_SERVER, str(port)])
    monkeypatch.setattr(prefect_server, "_use_profile", lambda url, restore=None: None)
    results: list[tuple[str, bool]] = []
    threads = [threading.Thread(target=lambda: results.append(prefect_server.ensure_local_server(port=0)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(starts) == 1, "each command started its own server"
    assert len({url for url, _ in results}) == 1 and sorted(started for _, started in results) == [False, False, True]
    url = results[0][0]
    pid = prefect_server._read_record()["pid"]
    assert prefect_server.running_local_server() == url and background.pid_alive(pid)
    assert prefect_server.configure_prefect_env().source == "sailor-ui"

    assert prefect_server.stop_local_server()
    assert not background.pid_alive(pid) and prefect_server.running_local_server() is None
    assert not prefect_server.stop_local_server()  # nothing left to stop


def test_the_sailor_profile_points_plain_prefect_at_the_server_until_stopped(homes):
    url = "http://127.0.0.1:4999/api"
    assert prefect_server.active_profile() == ("ephemeral", None)
    previous = prefect_server._use_profile(url)  # Prefect's own profile code, in a child process
    assert previous == "ephemeral"
    assert prefect_server.active_profile() == (prefect_server.PROFILE, url)
    written = tomllib.loads((homes / "prefect" / "profiles.toml").read_text())
    assert written["profiles"][prefect_server.PROFILE]["PREFECT_API_URL"] == url
    prefect_server._use_profile(None, restore=previous)
    assert prefect_server.active_profile() == ("ephemeral", None)


def test_a_profile_the_user_chose_wins_over_the_local_server(homes, monkeypatch):
    (homes / "prefect").mkdir()
    (homes / "prefect" / "profiles.toml").write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "https://prefect.example/api"\n')
    monkeypatch.setattr(prefect_server, "ensure_local_server", lambda *a, **k: pytest.fail("started a server"))
    choice = prefect_server.configure_prefect_env(start_server=True)
    assert (choice.source, choice.api_url, choice.profile) == ("profile", "https://prefect.example/api", "team")
    assert not prefect_server.would_start_server()


def test_stop_brings_back_the_profile_the_user_had_across_a_restart_and_says_so(homes, monkeypatch):
    """The user's own profile is active; Sailor's server makes `sailor` active and says it replaced it; a
    restart (the server died) keeps that; `sailor ui --stop` makes the user's active again and says so."""
    monkeypatch.setattr(prefect_server, "server_command", lambda port: [sys.executable, "-c", FAKE_SERVER, str(port)])
    (homes / "prefect").mkdir(exist_ok=True)
    (homes / "prefect" / "profiles.toml").write_text('active = "mine"\n[profiles.mine]\n')
    url = prefect_server.start_local_server(port=0)
    try:
        assert prefect_server.active_profile() == (prefect_server.PROFILE, url)
        assert prefect_server.previous_profile() == "mine"
        choice = prefect_server.ApiChoice(api_url=url, source="started")
        assert "'sailor' points plain `prefect` commands at it and is now active (was 'mine')" in choice.describe()
        background.stop_group(int(prefect_server._read_record()["pid"]))  # it dies; the next command starts one
        url = prefect_server.start_local_server(port=0)
        assert prefect_server.active_profile() == (prefect_server.PROFILE, url)
        assert prefect_server.previous_profile() == "mine"
    finally:
        active = prefect_server.stop_local_server()
    assert active == "mine" and prefect_server.active_profile() == ("mine", None)
