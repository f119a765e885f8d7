"""Which Prefect API the CLI talks to, and the local server ``sailor ui`` runs.

Prefect with no ``PREFECT_API_URL`` starts a temporary server inside every
process (~20 s before the first task runs, and its runs vanish with it).  The
CLI avoids that when it can, in this order:

1. ``PREFECT_API_URL`` is set: use it (a team server, Prefect Cloud, a test server).
2. A server started by ``sailor ui`` is running (recorded in
   ``$SAILOR_HOME/prefect/server.json`` and answering ``/api/health``): use it,
   so runs appear in its UI and start at once.
3. ``sailor train`` starts that local server itself (once; it keeps running so
   the run stays visible in the UI, and later runs start at once).  With
   ``SAILOR_PREFECT_EPHEMERAL=1``, or for callers that do not ask for a server,
   Prefect's temporary server, with its database under ``$SAILOR_HOME/prefect``.

Everything here must run before ``prefect`` is imported (its settings are read
at import), so this module imports no Prefect itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sailor_core import settings
from sailor_core.errors import SailorError

DEFAULT_PORT = 4200


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiChoice:
    api_url: str | None  # None: Prefect's temporary in-process server
    source: str  # "env", "sailor-ui", "started", "ephemeral"

    def describe(self) -> str:
        if self.source == "env":
            return f"Prefect API {self.api_url} (PREFECT_API_URL)"
        if self.source == "sailor-ui":
            return f"Prefect server {self.api_url} (started by `sailor ui`; runs show in its UI)"
        if self.source == "started":
            return (f"started a local Prefect server at {self.api_url.removesuffix('/api')}/ "
                    f"(SQLite under {prefect_home()}); it keeps running so this run stays in its UI; "
                    "`sailor ui --stop` stops it")
        return ("no Prefect server running: using a temporary one for this run (~20 s to start; "
                "start one with `sailor ui` to skip that and watch runs in the UI)")


def prefect_home() -> Path:
    return settings.sailor_home() / "prefect"


def _server_record() -> Path:
    return prefect_home() / "server.json"


def healthy(api_url: str, timeout_s: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as resp:
            return resp.status == 200
    except OSError:
        return False


def running_local_server() -> str | None:
    """API URL of the server ``sailor ui`` started, if it still answers."""
    try:
        record = json.loads(_server_record().read_text())
    except (OSError, ValueError):
        return None
    url = record.get("api_url")
    return url if isinstance(url, str) and healthy(url) else None


def would_start_server() -> bool:
    """Whether ``configure_prefect_env(start_server=True)`` would start a server (worth a word to the user)."""
    return not os.environ.get("PREFECT_API_URL") and not running_local_server() and not settings.prefect_ephemeral()


def configure_prefect_env(*, start_server: bool = False) -> ApiChoice:
    """Point this process (and its children) at the right Prefect API; call before importing prefect.

    ``start_server``: with no server running, start the local one rather than
    paying Prefect's temporary in-process server (~20 s per run, runs vanish).
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if os.environ.get("PREFECT_API_URL"):
        return ApiChoice(api_url=os.environ["PREFECT_API_URL"], source="env")
    url = running_local_server()
    if url:
        os.environ["PREFECT_API_URL"] = url
        return ApiChoice(api_url=url, source="sailor-ui")
    if start_server and not settings.prefect_ephemeral():
        url = start_local_server()
        os.environ["PREFECT_API_URL"] = url
        return ApiChoice(api_url=url, source="started")
    prefect_home().mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home()))
    # A loaded machine can take longer than Prefect's default to start it.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    return ApiChoice(api_url=None, source="ephemeral")


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise SailorError("no free TCP port for the Prefect server")


def start_local_server(port: int = DEFAULT_PORT, timeout_s: float = 240.0) -> str:
    """Start (or find) the local Prefect server with SQLite under ``$SAILOR_HOME/prefect``; return its API URL."""
    url = running_local_server()
    if url:
        return url
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    port = _free_port(port)
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_API_URL=api_url, PREFECT_SERVER_API_HOST="127.0.0.1")
    log = open(home / "server.log", "ab")
    prefect_bin = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect_bin) if prefect_bin.exists() else "prefect", "server", "start",
           "--host", "127.0.0.1", "--port", str(port)]
    # Its own session: the server outlives this command and a Ctrl-C in this terminal.
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SailorError(f"the Prefect server exited with code {proc.returncode}; see {home / 'server.log'}")
        if healthy(api_url):
            _server_record().write_text(json.dumps({"api_url": api_url, "pid": proc.pid, "port": port}))
            return api_url
        time.sleep(0.5)
    os.killpg(proc.pid, 15)  # its own session: the server and its children
    raise SailorError(f"the Prefect server did not answer within {timeout_s:.0f} s; see {home / 'server.log'}")


def stop_local_server() -> bool:
    """Stop the server ``sailor ui`` started; False when none was recorded."""
    import signal

    try:
        record = json.loads(_server_record().read_text())
    except (OSError, ValueError):
        return False
    pid = int(record.get("pid", 0))
    if pid > 0:
        try:
            os.killpg(pid, signal.SIGTERM)  # the server runs uvicorn children in its session
        except ProcessLookupError:
            pass
    _server_record().unlink(missing_ok=True)
    return True
