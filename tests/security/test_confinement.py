"""From inside an instance of job A, as an attacker would: job B's instance (on the other cloud),
the host's processes, namespaces and files are out of reach, and the image is read-only.

Real parts: one embedded cloud (moto EC2, the GCE fake) with its state under the Sailor home as
`sailor cloud up` keeps it, instances booted through the providers, each confined
(infra/local/confine.py) in its own network namespace.  Job A's startup script runs every
attempt and writes what it got into its root; the host reads it.  The machine must allow
confinement (root with namespaces: CI does); the tests fail where it does not.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import buckets_dir, runs_dir
from infra.local import confine
from infra.local.cloud import EmbeddedCloud
from infra.local.image import image_for_this_machine
from infra.local.machines import Machines
from infra.records import job_labels
from sailor_core.errors import InputError
from tests.infra.conftest import make_providers, wait_until

CANARY = "canary-7f3a9c"
CHECKOUT = Path(__file__).resolve().parents[2]
ZONES = {"aws": ("us-east-1a", "g4dn.xlarge"), "gcp": ("us-central1-a", "n1-standard-4-t4x1")}


@pytest.fixture(scope="module")
def cloud():
    assert confine.confine_unavailable() is None, f"confinement unavailable here: {confine.confine_unavailable()}"
    run = runs_dir() / "confinement-test"
    home = Path(os.environ["SAILOR_HOME"])
    (home / "cloud-records.json").write_text(f'{{"secret": "{CANARY}"}}')  # stands for the cloud's records
    prefect = Path(os.environ["PREFECT_HOME"])
    prefect.mkdir(parents=True, exist_ok=True)
    (prefect / "canary.db").write_text(CANARY)  # beside Prefect's database (flow-run parameters)
    with EmbeddedCloud(state_dir=run, buckets_dir=buckets_dir(), notice_s=0.5, tick_s=0.1,
                       halt_grace_s=0.3) as embedded:
        assert embedded.machines.confinement is not None and embedded.network.enforced
        yield embedded


@pytest.fixture(scope="module")
def providers(cloud):
    p = make_providers(cloud)
    p["gcp"].zones = ["us-central1-a"]
    return p


@pytest.fixture
def secret_process():
    """A host process holding a secret in its environment, as the controller holds the user's keys."""
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": CANARY}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # host-canary"], env=env)
    yield proc
    proc.kill()
    proc.wait()


def _boot(cloud, providers, which: str, job: str, script: str):
    zone, itype = ZONES[which]
    (inst,) = providers[which].run_instances(zone=zone, instance_type=itype, count=1, labels=job_labels(job, 1),
                                             startup_script=script)
    assert wait_until(lambda: cloud.machines.get(inst.instance_id) is not None, timeout_s=30)
    return cloud.machines.get(inst.instance_id)


def _attempts(cloud, b, host_pid: int) -> dict[str, str]:
    """Each attempt of A against B and the host: a shell command that must fail."""
    image = cloud.machines.image
    b_ns = cloud.network._namespaces[b.instance_id]
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    return {
        "runs as root": 'test "$(id -u)" = 0',
        "sees a host process": f"grep -q host-canary /proc/{host_pid}/cmdline",
        "sees B's processes": f"test -e /proc/{b.process.pid}",
        "reads a host process's environ": f"grep -q {CANARY} /proc/{host_pid}/environ",
        "reads PID 1's environ": "cat /proc/1/environ",
        "enters PID 1's namespaces": "nsenter -t 1 -n -m true",
        "enters the host's network namespace": f"nsenter --net=/proc/{host_pid}/ns/net true",
        "enters B's network namespace (ip netns exec)": f"ip netns exec {b_ns} true",
        "enters B's network namespace (its file)": f"nsenter --net=/run/netns/{b_ns} true",
        "makes a namespace": "unshare --net true",
        "lists B's root": f"ls {q(b.root)}",
        "reads B's root": f"cat {q(b.root / 'canary.txt')}",
        "reads B's startup script": f"cat {q(b.root / 'var/lib/cloud/startup-script')}",
        "writes B's root": f"touch {q(b.root / 'from-a')}",
        "reads B's hypervisor folder": f"cat {q(b.directory / 'console.log')}",
        "writes the image": f"touch {q(image.root / 'from-a')}",
        "writes the image's Python": f"touch {q(image.python.parent / 'from-a')}",
        "writes the image's site-packages": f"touch {q(image.backing_dir / 'from-a')}",
        "writes the shared environment cache": f"mkdir {q(image.env_cache / 'from-a')}",
        "reads /etc/shadow": "grep -q root: /etc/shadow",
        "reads the Sailor home's records": f"cat {q(Path(os.environ['SAILOR_HOME']) / 'cloud-records.json')}",
        "reads the Prefect home": f"cat {q(Path(os.environ['PREFECT_HOME']) / 'canary.db')}",
        "lists the buckets on disk": f"ls {q(cloud.disk.root)}",
        "reads the controller's checkout": f"cat {q(CHECKOUT / 'README.md')}",
        "mounts": 'mkdir -p "$HOME/mnt" && mount -t tmpfs none "$HOME/mnt"',
    }


_CONTROLS = {  # what an instance must still do: the attempts fail for being refused, not for a broken instance
    "writes its root": 'touch "$HOME/ok"',
    "runs the image's Python": '"$SAILOR_PYTHON" -c "import sys"',
    "writes /dev/shm": "touch /dev/shm/ok",
    "reaches its own network": "ip addr show eth0",
}


def _probe_script(attempts: dict[str, str]) -> str:
    lines = ["#!/bin/bash", 'out="$HOME/probes.txt"', 'PATH="$PATH:/usr/sbin:/sbin"']
    for name, cmd in {**attempts, **_CONTROLS}.items():
        lines.append(f"if ( {cmd} ) >/dev/null 2>&1; then echo {shlex.quote(name)}=ok; "
                     f"else echo {shlex.quote(name)}=refused; fi >> \"$out\"")
    lines += ['echo done > "$HOME/probes.done"', "exec sleep 600"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("a_cloud", ["aws", "gcp"])
def test_an_instance_of_job_a_reaches_nothing_of_job_b_nor_the_host(cloud, providers, secret_process, a_cloud):
    b_cloud = "gcp" if a_cloud == "aws" else "aws"
    image = cloud.machines.image
    marks = [p / "from-a" for p in (image.root, image.python.parent, image.backing_dir, image.env_cache)]
    for mark in marks:  # what an unconfined run of this test would have left
        shutil.rmtree(mark, ignore_errors=True) if mark.is_dir() else mark.unlink(missing_ok=True)
    b = _boot(cloud, providers, b_cloud, f"conf-b-{a_cloud}",
              f'#!/bin/bash\necho {CANARY} > "$HOME/canary.txt"\nexec sleep 600\n')
    assert wait_until(lambda: (b.root / "canary.txt").exists(), timeout_s=30)
    attempts = _attempts(cloud, b, secret_process.pid)
    a = _boot(cloud, providers, a_cloud, f"conf-a-{a_cloud}", _probe_script(attempts))
    assert wait_until(lambda: (a.root / "probes.done").exists(), timeout_s=60), \
        (a.directory / "console.log").read_text()[-2000:]
    got = dict(line.split("=", 1) for line in (a.root / "probes.txt").read_text().splitlines())
    assert {k: got[k] for k in _CONTROLS} == dict.fromkeys(_CONTROLS, "ok")
    allowed = [name for name in attempts if got[name] != "refused"]
    assert not allowed, f"from inside job A: {allowed}"
    assert not (b.root / "from-a").exists() and (b.root / "canary.txt").read_text().strip() == CANARY
    assert not any(mark.exists() for mark in marks)
    assert a.jail.uid != b.jail.uid and (a.root / "ok").stat().st_uid == a.jail.uid
    for m in (a, b):
        cloud.machines.halt(m.instance_id)


def test_an_unconfined_cloud_is_the_documented_weaker_mode(tmp_path, monkeypatch):
    """``SAILOR_EMBEDDED_CONFINE=off`` (what a machine without root or namespaces gets): the instance
    runs as this user, seeing the machine as it does."""
    monkeypatch.setenv("SAILOR_EMBEDDED_CONFINE", "off")
    machines = Machines(tmp_path)
    assert machines.confinement is None
    m = machines.boot(instance_id="i-weak", cloud="aws", zone="us-east-1a",
                      script='#!/bin/bash\nid -u > "$HOME/uid"\nls /proc > "$HOME/procs"\n')
    assert wait_until(lambda: m.process.poll() is not None, timeout_s=30)
    assert (m.root / "uid").read_text().strip() == str(os.getuid())
    assert str(os.getpid()) in (m.root / "procs").read_text().split()  # the host's PIDs in view


def test_the_fallback_is_said_in_one_line_and_a_bad_setting_refused(monkeypatch, caplog):
    monkeypatch.setattr(confine, "confine_unavailable", lambda: "not root")
    monkeypatch.setenv("SAILOR_EMBEDDED_CONFINE", "auto")
    with caplog.at_level(logging.WARNING, logger="sailor.infra.local"):
        assert confine.choose_confined() is False
    (line,) = [r.getMessage() for r in caplog.records]
    assert "unconfined" in line and "not root" in line and "\n" not in line
    monkeypatch.setenv("SAILOR_EMBEDDED_CONFINE", "on")
    with pytest.raises(InputError, match="cannot be confined here: not root"):
        confine.choose_confined()
    monkeypatch.setenv("SAILOR_EMBEDDED_CONFINE", "jail")
    with pytest.raises(InputError, match="expected auto, on or off"):
        confine.choose_confined()


@pytest.mark.parametrize("confined", [True, False])
def test_an_instances_own_pid_maps_to_the_hosts_while_it_lives(tmp_path, confined):
    """What harnesses signal from outside (a worker the agent reports by its own number)."""
    machines = Machines(tmp_path, image=image_for_this_machine(), confined=confined)
    m = machines.boot(instance_id="i-pid", cloud="aws", zone="us-east-1a",
                      script='#!/bin/bash\necho $$ > "$HOME/pid.tmp" && mv "$HOME/pid.tmp" "$HOME/pid"\nexec sleep 600\n')
    try:
        assert wait_until(lambda: (m.root / "pid").exists(), timeout_s=30)
        own = int((m.root / "pid").read_text())
        host = confine.host_pid("i-pid", own)
        assert host is not None and (host != own) == confined
        assert Path(f"/proc/{host}/cmdline").read_bytes().startswith(b"sleep\x00600")
        assert confine.host_pid("i-other", own) is None
    finally:
        machines.halt("i-pid")
    assert confine.host_pid("i-pid", own) is None
