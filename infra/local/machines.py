"""The "hardware" of the embedded cloud: each running instance is a local process group.

An instance's startup script (GCE metadata ``startup-script``) or user-data (EC2)
runs as its own session, with the instance's identity in the environment.
Preemption follows the clouds: a notice in the instance metadata, SIGTERM
(GCE sends an ACPI soft-off), the notice period, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sailor_core import settings

# Paths inside an instance's metadata tree, as the real metadata servers name them.
AWS_SPOT_NOTICE = "latest/meta-data/spot/instance-action"
GCP_PREEMPTED = "computeMetadata/v1/instance/preempted"
LOCAL_ADDRESS = "127.0.0.1"


_SECRET_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                         "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
                         "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "GOOGLE_APPLICATION_CREDENTIALS",
                         "GOOGLE_OAUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", "PREFECT_API_KEY"})


def _is_secret_env(name: str) -> bool:
    upper = name.upper()
    return (upper in _SECRET_ENV or upper.startswith("CLOUDSDK_AUTH")
            or upper.endswith(("_SECRET", "_SECRET_KEY", "_TOKEN", "_PASSWORD", "_API_KEY", "_CREDENTIALS")))


@dataclass(slots=True, kw_only=True)
class Machine:
    instance_id: str
    cloud: str
    zone: str
    directory: Path
    process: subprocess.Popen | None = None
    preempting: bool = False
    ended: bool = False
    started_at: float = field(default_factory=time.time)

    @property
    def metadata_dir(self) -> Path:
        return self.directory / "metadata"


class Machines:
    """Local process groups standing in for instances; thread-safe."""

    def __init__(self, root: Path, *, metadata_url: str | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.metadata_url = metadata_url  # base URL serving <id>/<metadata path>
        self._machines: dict[str, Machine] = {}
        self._lock = threading.RLock()

    def get(self, instance_id: str) -> Machine | None:
        with self._lock:
            return self._machines.get(instance_id)

    def all(self) -> list[Machine]:
        with self._lock:
            return list(self._machines.values())

    def boot(self, *, instance_id: str, cloud: str, zone: str, script: str | None) -> Machine:
        """Start the instance's script (once); an instance without one just idles."""
        with self._lock:
            if instance_id in self._machines:
                return self._machines[instance_id]
            directory = self.root / instance_id
            directory.mkdir(parents=True, exist_ok=True)
            machine = Machine(instance_id=instance_id, cloud=cloud, zone=zone, directory=directory)
            self._machines[instance_id] = machine
            self._write_metadata(machine, preempted=False)
            if script and script.strip():
                machine.process = self._start(machine, script)
            return machine

    def _start(self, machine: Machine, script: str) -> subprocess.Popen:
        path = machine.directory / "startup-script"
        path.write_text(script)
        path.chmod(0o755)
        argv = [str(path)] if script.startswith("#!") else ["/bin/bash", str(path)]
        # A real VM starts without the launching user's environment: keep their cloud
        # credentials (and other secrets) out of the "instance" as the clouds would.
        env = {k: v for k, v in os.environ.items() if not _is_secret_env(k)}
        env.update({
            settings.INSTANCE_ID_ENV: machine.instance_id,
            settings.ZONE_ENV: machine.zone,
            settings.CLOUD_ENV: machine.cloud,
            settings.PRIVATE_IP_ENV: LOCAL_ADDRESS,
            settings.INSTANCE_DIR_ENV: str(machine.directory),
            settings.METADATA_DIR_ENV: str(machine.metadata_dir),
            settings.PYTHON_ENV: sys.executable,
        })
        if self.metadata_url:
            env[settings.METADATA_URL_ENV] = f"{self.metadata_url}/{machine.instance_id}"
        log = (machine.directory / "console.log").open("ab")
        try:
            return subprocess.Popen(
                argv,
                cwd=os.getcwd(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: one signal reaches all of it
            )
        finally:
            log.close()

    def _write_metadata(self, machine: Machine, *, preempted: bool, notice_s: float = 0.0) -> None:
        aws = machine.metadata_dir / AWS_SPOT_NOTICE
        gcp = machine.metadata_dir / GCP_PREEMPTED
        aws.parent.mkdir(parents=True, exist_ok=True)
        gcp.parent.mkdir(parents=True, exist_ok=True)
        if preempted:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + notice_s))
            tmp = aws.with_suffix(".tmp")
            tmp.write_text(json.dumps({"action": "terminate", "time": when}))
            tmp.replace(aws)  # atomic: a poller never reads half a notice
        gcp_tmp = gcp.with_suffix(".tmp")
        gcp_tmp.write_text("TRUE" if preempted else "FALSE")
        gcp_tmp.replace(gcp)

    def give_notice(self, instance_id: str, notice_s: float) -> Machine | None:
        """Post the preemption notice and SIGTERM the group; returns the machine."""
        with self._lock:
            machine = self._machines.get(instance_id)
            if machine is None or machine.preempting or machine.ended:
                return None
            machine.preempting = True
        self._write_metadata(machine, preempted=True, notice_s=notice_s)
        self._signal(machine, signal.SIGTERM)
        return machine

    def halt(self, instance_id: str, *, grace_s: float = 0.0) -> None:
        """Power off: SIGTERM, up to ``grace_s`` for the group to exit, then SIGKILL."""
        machine = self.get(instance_id)
        if machine is None or machine.ended:
            return
        if grace_s > 0 and not machine.preempting:
            self._signal(machine, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while grace_s > 0 and time.monotonic() < deadline and self._alive(machine):
            time.sleep(0.05)
        self._signal(machine, signal.SIGKILL)
        if machine.process is not None:
            try:
                machine.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        machine.ended = True

    def _alive(self, machine: Machine) -> bool:
        if machine.process is None:
            return False
        machine.process.poll()  # reap the leader so a zombie does not count as alive
        try:
            os.killpg(machine.process.pid, 0)  # anyone left in the group?
            return True
        except ProcessLookupError:
            return False

    @staticmethod
    def _signal(machine: Machine, sig: int) -> None:
        if machine.process is None:
            return
        try:
            os.killpg(machine.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def halt_all(self) -> None:
        for machine in self.all():
            self.halt(machine.instance_id)

    def remove_files(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
