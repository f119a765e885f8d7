"""The embedded buckets' `rclone serve` never outlives the process that started it: stopped, or
its owner ended in any way (SIGKILL, SIGTERM's default action, ``os._exit`` as pytest-timeout's
does), no rclone over the folder is left (rclone runs in a session of its own, out of reach of a
terminal's Ctrl-C, so only its tether ends it with its owner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local.object_store import DiskBuckets
from tests.infra.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _servers_over(root: Path) -> list[int]:
    """The pids of the processes serving ``root`` (rclone and its tether), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended while we looked
            continue
        if b"serve" in args and str(root).encode() in args:
            found.append(int(entry.name))
    return found


def test_stop_ends_the_server(tmp_path):
    buckets = DiskBuckets(tmp_path / "buckets").start()
    assert _servers_over(tmp_path / "buckets")
    buckets.stop()
    assert _servers_over(tmp_path / "buckets") == []
    assert not list(tmp_path.glob("rclone-*.pid"))


OWNER = """
import os, sys, time
from infra.local.object_store import DiskBuckets
buckets = DiskBuckets(sys.argv[1]).start()
print(buckets.endpoint, flush=True)
sys.stdin.readline()  # the test has seen the server
if sys.argv[2] == "os._exit":
    os._exit(1)
time.sleep(600)
"""


@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM", "os._exit"])
def test_no_server_outlives_its_owner(tmp_path, end):
    root = tmp_path / "buckets"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(root), end], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().startswith("http://"), "the owner's buckets did not start"
        assert _servers_over(root), "no rclone over the folder while its owner lives"
        if end == "os._exit":
            owner.stdin.write("go\n")
            owner.stdin.flush()
        else:
            owner.send_signal(getattr(signal, end))
        owner.wait(timeout=60)
        # a bounded wait for the tether to see its owner gone: it ends rclone, then itself
        assert wait_until(lambda: not _servers_over(root), timeout_s=30), \
            f"left running after the owner's {end}: {_servers_over(root)}"
    finally:
        owner.kill()
        owner.wait()
        for pid in _servers_over(root):  # a failed run leaves none behind either
            os.kill(pid, signal.SIGKILL)
