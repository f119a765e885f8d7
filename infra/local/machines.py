"""The "hardware" of the embedded cloud: each running instance is a local process group.

An instance's startup script (GCE metadata ``startup-script``) or user-data (EC2)
runs as its own session in the instance's root directory, with an environment made
from nothing but the instance's identity, the clouds' endpoints and its metadata
server, and (``netns`` network) in its own network namespace; confined (``confine.py``: root
with namespaces) it runs as its own user in its own PID and mount namespaces, seeing its root,
the read-only image and a few devices only.
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

from infra.local.confine import Confinement, Jail, choose_confined
from infra.local.network import pid_alive
from sailor_core import settings

# Paths inside an instance's metadata tree, as the real metadata servers name them.
AWS_SPOT_NOTICE = "latest/meta-data/spot/instance-action"
GCP_PREEMPTED = "computeMetadata/v1/instance/preempted"
LOCAL_ADDRESS = "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    """What an embedded instance is: its GPUs (what the image's nvidia-smi lists), its addresses."""

    gpu: str | None = None
    num_gpus: int = 0
    private_ip: str = LOCAL_ADDRESS
    public_ip: str = LOCAL_ADDRESS


@dataclass(slots=True, kw_only=True)
class Machine:
    instance_id: str
    cloud: str
    zone: str
    directory: Path  # the hypervisor's: metadata, console log, the root below
    hardware: Hardware = field(default_factory=Hardware)
    process: subprocess.Popen | None = None
    preempting: bool = False
    ended: bool = False
    started_at: float = field(default_factory=time.time)
    jail: Jail | None = None  # its user and view when confined

    @property
    def metadata_dir(self) -> Path:
        return self.directory / "metadata"

    @property
    def root(self) -> Path:
        """The instance's own disk: its processes' home, working and temporary directory."""
        return self.directory / "root"


PGID_FILE = "pgid"


def reap_dead_runs(runs: Path) -> list[str]:
    """End the instances that embedded clouds, now dead, left running under ``runs/<pid>/`` (their
    process groups), and remove those folders: a new cloud never leaves an old one's instances on.
    Returns the instance ids reaped."""
    reaped: list[str] = []
    for run in sorted(runs.glob("*")) if runs.is_dir() else []:
        if not run.name.isdigit() or pid_alive(int(run.name)):
            continue
        for pgid_file in run.glob(f"instances/*/{PGID_FILE}"):
            try:
                os.killpg(int(pgid_file.read_text()), signal.SIGKILL)
                reaped.append(pgid_file.parent.name)
            except (ProcessLookupError, PermissionError, ValueError):
                pass
        shutil.rmtree(run, ignore_errors=True)
    return reaped


class Machines:
    """Local process groups standing in for instances; thread-safe.

    An instance sees only its root directory (working directory, HOME, TMPDIR) and the image
    (``image``: Python with the framework, no Sailor); its environment is built from nothing
    (no variable of the process that runs the cloud), with its identity, the endpoints of the
    clouds (``endpoint_env``) and its metadata server.  ``network`` puts it in its own network
    namespace.  ``confined`` (default: where the machine allows it, ``confine.choose_confined``)
    runs it as its own user in its own PID and mount namespaces, where the image is read-only
    and its environments are made on its own disk.  ``trace_files`` runs it under strace to
    audit which files it touches.  An ended instance's folder (its disk, metadata and console)
    is removed unless ``keep_ended_disks``.
    """

    def __init__(self, root: Path, *, metadata_url: str | None = None, image=None, network=None,
                 endpoint_env: dict[str, str] | None = None, notice_s: float | None = None,
                 trace_files: bool = False, keep_ended_disks: bool = False, confined: bool | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.metadata_url = metadata_url  # base URL serving <id>/<metadata path>
        self.image = image  # infra.local.image.Image, or None: the instance runs this interpreter
        self.network = network  # infra.local.network.Network, or None: all on 127.0.0.1
        self.endpoint_env = dict(endpoint_env or {})
        self.notice_s = notice_s
        self.trace_files = trace_files
        self.keep_ended_disks = keep_ended_disks  # asked for by an audit (the chaos harness): kept until the cloud's end
        self.confinement = Confinement(image) if (choose_confined() if confined is None else confined) else None
        self._machines: dict[str, Machine] = {}
        self._lock = threading.RLock()

    def get(self, instance_id: str) -> Machine | None:
        with self._lock:
            return self._machines.get(instance_id)

    def all(self) -> list[Machine]:
        with self._lock:
            return list(self._machines.values())

    def boot(self, *, instance_id: str, cloud: str, zone: str, script: str | None,
             hardware: Hardware | None = None) -> Machine:
        """Start the instance's script (once); an instance without one just idles."""
        with self._lock:
            if instance_id in self._machines:
                return self._machines[instance_id]
            directory = self.root / instance_id
            directory.mkdir(parents=True, exist_ok=True)
            machine = Machine(instance_id=instance_id, cloud=cloud, zone=zone, directory=directory,
                              hardware=hardware or Hardware())
            machine.root.mkdir(exist_ok=True)
            (machine.root / "tmp").mkdir(exist_ok=True)
            self._machines[instance_id] = machine
            self._write_metadata(machine, preempted=False)
            if self.network is not None:
                self.network.attach(instance_id)
            if script and script.strip():
                machine.process = self._start(machine, script)
                # what a later cloud over this folder ends if this one dies without halting it
                (directory / PGID_FILE).write_text(str(machine.process.pid))
            return machine

    def environment(self, machine: Machine) -> dict[str, str]:
        """The instance's environment, from nothing: a VM starts without the launching user's."""
        hw = machine.hardware
        path = "/usr/local/bin:/usr/bin:/bin"
        env = {
            "PATH": f"{self.image.python.parent}:{self.image.bin_dir}:{path}" if self.image is not None else path,
            "HOME": str(machine.root),
            "TMPDIR": str(machine.root / "tmp"),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",  # the image is read-only to the instance
            settings.INSTANCE_ID_ENV: machine.instance_id,
            settings.ZONE_ENV: machine.zone,
            settings.CLOUD_ENV: machine.cloud,
            settings.PRIVATE_IP_ENV: hw.private_ip,
            settings.INSTANCE_DIR_ENV: str(machine.root),
            settings.PYTHON_ENV: str(self.image.python) if self.image is not None else sys.executable,
            settings.EMBEDDED_GPUS_ENV: f"{hw.num_gpus} {hw.gpu or 'none'}",
        }
        if self.image is not None:
            # confined, the image is read-only: each instance makes its environment on its own disk, as a VM does
            env[settings.ENV_CACHE_ENV] = str(machine.root / "opt" / "sailor" / "envs" if self.confinement is not None
                                              else self.image.env_cache)
        if self.notice_s is not None:
            env[settings.NOTICE_S_ENV] = str(self.notice_s)
        env.update(self.endpoint_env)
        if self.metadata_url:
            # The server knows the caller by its address (netns); on the shared 127.0.0.1 (host) it
            # must name itself (infra/local/metadata_door.py).
            by_address = self.network is not None and self.network.enforced
            base = self.metadata_url if by_address else f"{self.metadata_url}/{machine.instance_id}"
            env[settings.METADATA_URL_ENV] = base
            # where obstore (AWS_METADATA_ENDPOINT) and botocore ask for the instance profile's credentials (IMDSv2)
            env["AWS_METADATA_ENDPOINT"] = base
            env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = base + "/"
            if machine.cloud == "gcp":  # where obstore asks for the VM's service-account token (GCS)
                env["GCE_METADATA_HOST"] = base.split("://", 1)[-1]
        return env

    def _start(self, machine: Machine, script: str) -> subprocess.Popen:
        path = machine.root / "var" / "lib" / "cloud" / "startup-script"  # cloud-init's copy, on its disk
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script)
        path.chmod(0o755)
        argv = [str(path)] if script.startswith("#!") else ["/bin/bash", str(path)]
        trace = machine.directory / "files.strace"
        if self.trace_files:
            argv = ["strace", "-f", "-qq", "-e", "trace=%file,%desc", "-e", "signal=none", "-o", str(trace), *argv]
        if self.confinement is not None:
            machine.jail = self.confinement.prepare(machine.directory, machine.root,
                                                    writable_files=(trace,) if self.trace_files else ())
            argv = self.confinement.wrap(machine.jail, argv)
        if self.network is not None:
            argv = self.network.wrap(machine.instance_id, argv)
        log = (machine.directory / "console.log").open("ab")
        try:
            return subprocess.Popen(
                argv,
                cwd=str(machine.root),
                env=self.environment(machine),
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
        if self.network is not None:
            self.network.detach(instance_id)
        # Its disk goes with it (wheel, scripts, rank logs, metadata, console): the agent has put its
        # logs in the job's bucket (`sailor logs`), and nothing of a job stays on the host after it.
        if not self.keep_ended_disks:
            shutil.rmtree(machine.directory, ignore_errors=True)

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
