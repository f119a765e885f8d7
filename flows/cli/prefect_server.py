"""Which Prefect API the CLI talks to, and the local server ``sailor ui`` runs.

Prefect with no ``PREFECT_API_URL`` starts a temporary server inside every
process (~20 s before the first task runs, and its runs vanish with it).  The
CLI avoids that when it can, in this order:

1. ``PREFECT_API_URL`` is set: use it (a team server, Prefect Cloud, a test server).
2. The active Prefect profile sets ``PREFECT_API_URL`` (``prefect profile use ...``) and is
   not Sailor's own: use it, as plain ``prefect`` commands do.
3. A server started by ``sailor ui`` (or ``sailor train``) is running (recorded in
   ``$SAILOR_HOME/prefect/server.json`` and answering ``/api/health``): use it.
4. ``sailor train`` / ``sailor deploy`` start that local server themselves.  With
   ``SAILOR_PREFECT_EPHEMERAL=1``, or for callers that do not ask for a server,
   Prefect's temporary server, with its database under ``$SAILOR_HOME/prefect``.

Starting the local server holds a lock (``server.lock``), so commands started at once
share one server.  Once it answers, the Prefect profile ``sailor`` holds its API URL and is
made active, so plain ``prefect ...`` commands (work pools, deployments, workers) reach it;
the command that started it says so, naming the profile it replaced (recorded in
``server.json``: the one active before Sailor's first start, kept across restarts of a dead
server).  ``sailor ui --stop`` stops the server, the worker ``sailor deploy --worker`` started,
and makes that profile active again (if ``sailor`` still is: a profile the user chose since
stays), and says which profile is active.

The server is ``prefect server start`` in its own session with its output in
``server.log``.  Not ``prefect server start --background``: that leaves the server's
output on pipes to a process that exits at once, so a server that fails to start says
nothing, and its log is lost.

Everything here must run before ``prefect`` is imported (its settings are read once, at
import), so this module imports no Prefect; the profile is written by a child process.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flows.cli import background
from sailor_core import settings
from sailor_core.errors import SailorError
from sailor_core.ports import free_port

DEFAULT_PORT = 4200
PROFILE = "sailor"  # the Prefect profile that points at the local server


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiChoice:
    api_url: str | None  # None: Prefect's temporary in-process server
    source: str  # "env", "profile", "sailor-ui", "started", "ephemeral"
    profile: str | None = None  # the active Prefect profile it came from (source "profile")

    @property
    def ui_url(self) -> str | None:
        return ui_url(self.api_url) if self.api_url else None

    def describe(self) -> str:
        if self.source == "env":
            return f"Prefect API {self.api_url} (PREFECT_API_URL)"
        if self.source == "profile":
            return f"Prefect API {self.api_url} (Prefect profile {self.profile!r})"
        if self.source == "sailor-ui":
            return f"Prefect server {self.ui_url} (started by `sailor ui`)"
        if self.source == "started":
            was = previous_profile()
            return (f"started a local Prefect server at {self.ui_url} (SQLite under {prefect_home()}); "
                    "it keeps running so runs stay in its UI; the Prefect profile "
                    f"{PROFILE!r} points plain `prefect` commands at it and is now active"
                    + (f" (was {was!r})" if was else "")
                    + "; `sailor ui --stop` stops it" + (f" and makes {was!r} active again" if was else ""))
        return ("no Prefect server running: using a temporary one for this run (~20 s to start; "
                "start one with `sailor ui` to skip that and watch runs in the UI)")


def ui_url(api_url: str) -> str:
    """The UI's root for a Prefect server's API URL (Prefect serves both from one port)."""
    return api_url.rstrip("/").removesuffix("/api") + "/"


def prefect_home() -> Path:
    return settings.sailor_home() / "prefect"


def _server_record() -> Path:
    return prefect_home() / "server.json"


def _read_record() -> dict:
    return background.read_record(_server_record())


def _write_record(record: dict) -> None:
    background.write_record(_server_record(), record)


@contextlib.contextmanager
def _server_lock() -> Iterator[None]:
    """One starter (or stopper) at a time per SAILOR_HOME; the others wait and then find its server."""
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "server.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def healthy(api_url: str, timeout_s: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as resp:
            return resp.status == 200
    except OSError:
        return False


def running_local_server() -> str | None:
    """API URL of the server ``sailor ui`` started, if it still answers."""
    url = _read_record().get("api_url")
    return url if isinstance(url, str) and healthy(url) else None


# ---- Prefect profiles (read here with tomllib; written by Prefect's own code in a child) ---------


def _profiles_path() -> Path:
    if os.environ.get("PREFECT_PROFILES_PATH"):
        return Path(os.environ["PREFECT_PROFILES_PATH"]).expanduser()
    home = os.environ.get("PREFECT_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".prefect") / "profiles.toml"


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def active_profile() -> tuple[str | None, str | None]:
    """(name, PREFECT_API_URL) of the active Prefect profile, as ``prefect`` would pick it."""
    user = _read_toml(_profiles_path())
    name = os.environ.get("PREFECT_PROFILE") or user.get("active") or "ephemeral"
    spec = importlib.util.find_spec("prefect")
    shipped = {}
    if spec is not None and spec.submodule_search_locations:
        shipped = _read_toml(Path(list(spec.submodule_search_locations)[0]) / "settings" / "profiles.toml")
    values = {**shipped.get("profiles", {}).get(name, {}), **user.get("profiles", {}).get(name, {})}
    url = values.get("PREFECT_API_URL")
    return name, url if isinstance(url, str) and url else None


def _use_profile(api_url: str | None, restore: str | None = None) -> str | None:
    """Make ``sailor`` (``PREFECT_API_URL=api_url``) the active profile and return the one it
    replaced; or, with ``restore``, make that one active again.  Prefect's own profile code does
    it, in a child: importing Prefect here would fix this process's settings too early."""
    args = ["use", api_url] if restore is None else ["restore", restore]
    try:
        out = subprocess.run([sys.executable, "-m", "flows.cli.prefect_server", *args], capture_output=True,
                             text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                          if k not in ("PREFECT_API_URL", "PREFECT_PROFILE")})
    except subprocess.TimeoutExpired:
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _profile_main(argv: list[str]) -> int:
    from prefect.settings.profiles import load_profiles, save_profiles  # lazy: only in this child

    profiles = load_profiles()
    if argv[0] == "use":
        previous = profiles.active_name or "ephemeral"  # Prefect's own default when none is named
        profiles.update_profile(PROFILE, settings={"PREFECT_API_URL": argv[1]})
        profiles.set_active(PROFILE)
        save_profiles(profiles)
        print(previous if previous != PROFILE else "")
    elif argv[0] == "restore" and profiles.active_name == PROFILE:
        profiles.set_active(argv[1] if argv[1] in profiles.names else None, check=False)
        save_profiles(profiles)
    return 0


# ---- choosing the API ---------------------------------------------------------------------------


def would_start_server() -> bool:
    """Whether ``configure_prefect_env(start_server=True)`` would start a server (worth a word to the user)."""
    return (not os.environ.get("PREFECT_API_URL") and _other_profile() is None and not running_local_server()
            and not settings.prefect_ephemeral())


def _other_profile() -> tuple[str, str] | None:
    name, url = active_profile()
    return (name, url) if url and name != PROFILE else None


def configure_prefect_env(*, start_server: bool = False) -> ApiChoice:
    """Point this process (and its children) at the right Prefect API; call before importing prefect.

    ``start_server``: with no server running, start the local one rather than
    paying Prefect's temporary in-process server (~20 s per run, runs vanish).
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # The terminal stays quiet (warnings and errors only); every INFO line still reaches the server.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    if os.environ.get("PREFECT_API_URL"):
        return ApiChoice(api_url=os.environ["PREFECT_API_URL"], source="env")
    if other := _other_profile():
        os.environ["PREFECT_API_URL"] = other[1]
        return ApiChoice(api_url=other[1], source="profile", profile=other[0])
    url = running_local_server()
    if url:
        os.environ["PREFECT_API_URL"] = url
        return ApiChoice(api_url=url, source="sailor-ui")
    if start_server and not settings.prefect_ephemeral():
        url, started = ensure_local_server()
        os.environ["PREFECT_API_URL"] = url
        return ApiChoice(api_url=url, source="started" if started else "sailor-ui")
    prefect_home().mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home()))
    # A loaded machine can take longer than Prefect's default to start it.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    return ApiChoice(api_url=None, source="ephemeral")


# ---- the local server ---------------------------------------------------------------------------


def _wait_healthy(api_url: str, pid: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if healthy(api_url):
            return True
        if not background.pid_alive(pid):
            return False
        time.sleep(0.5)
    return False


def ensure_local_server(port: int = DEFAULT_PORT, timeout_s: float = 240.0) -> tuple[str, bool]:
    """The local server's API URL, starting it if none answers; and whether this call started it.

    Under the lock: a second caller waits for the first one's server instead of starting its own.
    """
    with _server_lock():
        url = running_local_server()
        if url:
            return url, False
        record = _read_record()
        # A start that was interrupted (its server may still come up), or a hung server.
        if record.get("pid") and background.pid_alive(int(record["pid"])):
            if _wait_healthy(record["api_url"], int(record["pid"]), time.monotonic() + timeout_s):
                return record["api_url"], False
            background.stop_group(int(record["pid"]))
        url = _start(port, timeout_s, previous_profile=record.get("previous_profile"))
        return url, True


def server_command(port: int) -> list[str]:
    prefect_bin = Path(sys.executable).with_name("prefect")
    return [str(prefect_bin) if prefect_bin.exists() else "prefect", "server", "start",
            "--host", "127.0.0.1", "--port", str(port)]


def _start(port: int, timeout_s: float, *, previous_profile: str | None) -> str:
    home = prefect_home()
    port = free_port(port)
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_PROFILE")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_API_URL=api_url, PREFECT_SERVER_API_HOST="127.0.0.1")
    proc = background.start(server_command(port), env=env, log=home / "server.log")
    record = {"api_url": api_url, "pid": proc.pid, "port": port, "previous_profile": previous_profile}
    _write_record(record)  # before it answers: `sailor ui --stop` can stop a start that is under way
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _server_record().unlink(missing_ok=True)
            raise SailorError(f"the Prefect server exited with code {proc.returncode}; see {home / 'server.log'}")
        if healthy(api_url):
            # The profile active before Sailor's first start is the one `sailor ui --stop` brings back: a
            # restart (the server died) finds `sailor` active and keeps the recorded one.
            replaced = _use_profile(api_url)
            record["previous_profile"] = previous_profile or replaced or ""
            _write_record(record)
            return api_url
        time.sleep(0.5)
    background.stop_group(proc.pid)
    _server_record().unlink(missing_ok=True)
    raise SailorError(f"the Prefect server did not answer within {timeout_s:.0f} s; see {home / 'server.log'}")


def start_local_server(port: int = DEFAULT_PORT, timeout_s: float = 240.0) -> str:
    """Start (or find) the local Prefect server with SQLite under ``$SAILOR_HOME/prefect``; return its API URL."""
    return ensure_local_server(port, timeout_s)[0]


def previous_profile() -> str | None:
    """The Prefect profile that was active before the local server made ``sailor`` active (None: not known)."""
    return _read_record().get("previous_profile") or None


def stop_local_server() -> str | None:
    """Stop the server Sailor started and make the Prefect profile that was active before it active
    again (when ``sailor`` still is: a profile the user chose since stays); None when no server was
    recorded, else the profile active now."""
    with _server_lock():
        record = _read_record()
        if not record:
            return None
        pid = int(record.get("pid", 0))
        if pid > 0:
            background.stop_group(pid)  # the server runs uvicorn children in its session
        _server_record().unlink(missing_ok=True)
        if record.get("previous_profile"):
            _use_profile(None, restore=record["previous_profile"])
        return active_profile()[0] or "ephemeral"


if __name__ == "__main__":
    sys.exit(_profile_main(sys.argv[1:]))
