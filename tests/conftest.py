"""Shared by every area's tests: keep Prefect and Sailor off the user's home directory.

Prefect reads its settings when first imported, so this runs before any test
module imports it.  Areas that need a Prefect server use their own fixtures
(tests/flows/conftest.py starts one real server per session).
"""

import atexit
import os
import shutil
import subprocess
import tempfile

import pytest

# Forced, not defaulted: a test run must never read or write the user's jobs, profiles or Prefect DB.
# The process's one Sailor home: what the process starts once (its embedded cloud, over the home's
# buckets; Prefect's settings) belongs to it, so the areas' fixtures use it rather than make another.
PROCESS_SAILOR_HOME = tempfile.mkdtemp(prefix="sailor-test-home-")
# Removed when the process exits, after its session fixtures have stopped what ran over it: a run of
# the suite would otherwise leave hundreds of MB of jobs, buckets and Prefect databases in /tmp.
atexit.register(shutil.rmtree, PROCESS_SAILOR_HOME, ignore_errors=True)
os.environ["SAILOR_HOME"] = PROCESS_SAILOR_HOME
os.environ["PREFECT_HOME"] = os.path.join(PROCESS_SAILOR_HOME, "prefect")
os.environ.pop("SAILOR_JOBS_URL", None)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# One terminal width for every test that reads what Rich prints (the CLI's tables, --help). Without it
# the width depended on how pytest ran: pytest imports readline (_pytest/capture.py's
# _readline_workaround), and GNU readline, finding no terminal, puts COLUMNS=80 into the C environment
# (not os.environ) which the pytest-xdist workers inherit; with `-n 0`, no COLUMNS, so Rich measured
# stdin/stdout/stderr: the terminal's width, or 80 where none is one.  A line wrapped or an option
# name was cut in one run and not the other.  A test wanting a narrow terminal sets its own COLUMNS.
# TERMINAL_WIDTH would fix Typer's --help at another width: not here.
os.environ["COLUMNS"] = "200"
os.environ.pop("TERMINAL_WIDTH", None)


@pytest.fixture
def sailor_cli(capsys):
    """Run ``flows.cli.app.main`` in this process (the console script's code path, much faster than a
    subprocess); returns a CompletedProcess with the exit code, stdout and stderr."""
    from flows.cli.app import main

    def run(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ)  # a command may point its process at the embedded buckets: gone when it exits
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.environ.clear()
            os.environ.update(env)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run


@pytest.fixture
def moto_s3(monkeypatch):
    """A real moto S3 server; its endpoint and test credentials are in the environment (workers
    started by the test inherit them).  Yields the endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # the S3-only variable too: an embedded cloud of another test in this worker may have set it, and it wins
    for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    yield endpoint
    server.stop()


@pytest.fixture
def gcs_fake(monkeypatch, tmp_path):
    """A local stand-in for GCS's XML API (tests/gcs_fake.py), configured the way obstore's GCSStore
    reaches an emulator: ``GOOGLE_BASE_URL`` plus a service-account file with ``disable_oauth``
    (workers started by the test inherit both).  Yields the FakeGCS; ``create_bucket`` makes buckets."""
    import json

    from tests.gcs_fake import FakeGCS

    fake = FakeGCS().start()
    key = tmp_path / "gcs-service-account.json"
    key.write_text(json.dumps({"gcs_base_url": fake.url, "disable_oauth": True, "client_email": "",
                               "private_key": "", "private_key_id": ""}))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(key))
    monkeypatch.setenv("GOOGLE_BASE_URL", fake.url)
    yield fake
    fake.stop()
