"""A flow run's cloud session: the providers it uses and what its instances need to know.

``CloudSession`` holds the providers one flow run uses -- the real clouds when
``SAILOR_CLOUDS`` asks for them (infra.config), else the embedded local cloud (moto's EC2 and S3
server and the local GCE fake, whose instances are local process groups in their own root
directories and network namespaces) -- and what the job rents besides instances: the bucket
prefix the instances reach it through (the agents' documents, Sailor's wheel, staged data and
checkpoints), its network rules and its identity.  Opening and closing one: ``tasks/cloud.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.bootstrap import read_boot_report, startup_script
from infra.code import CodeBundle, upload_code
from infra.errors import CloudConfigError
from infra.provider import CloudProvider, Feature
from infra.records import LOCAL_ADDRESS_LABEL, RENDEZVOUS_PORT, InstanceInfo, job_labels
from sailor_core import settings
from sailor_core.catalog.clouds import cloud_facts
from sailor_core.job.prerent import local_checkpoint_problem
from sailor_core.ports import free_port
from sailor_core.runtime.agent import post_preemption
from sailor_core.storage import open_storage
from sailor_core.zones import parse_zone
from tasks.workers import Assignment


@dataclass(slots=True, kw_only=True)
class CloudSession:
    """The providers of one flow run and what the flow needs to know about them."""

    mode: str  # "embedded" or "real"
    job_id: str
    jobs_url: str  # the job's URL in the bucket its instances reach: agents' documents, code, staged data
    home_url: str = ""  # the job's folder where the controller keeps its state (its default checkpoints' parent)
    providers: dict[str, CloudProvider]  # cloud name -> its provider (infra/providers.py)
    control_url: str | None = None  # the embedded cloud's control surface (preemption injection)
    control_secret: str | None = field(default=None, repr=False)  # its secret: the controller's alone
    network: str = "real"  # embedded: "netns" (own addresses, rules enforced) or "host" (all on 127.0.0.1)
    shutdown_s: float = 120.0  # terminate -> billing stops (real clouds bill the shutdown)
    worker_stop_s: float = 10.0  # SIGTERM -> workers checkpointed and exited
    heartbeat_timeout_s: float = 120.0
    code: CodeBundle | None = None  # Sailor's wheel in the job's bucket
    public_addresses: bool = False  # this attempt's instances span VPCs: they meet at their public addresses
    _closers: list = field(default_factory=list)
    _staged: dict = field(default_factory=dict)  # data files copied to the job's bucket: key -> size

    @property
    def labels(self) -> dict[str, str]:
        return job_labels(self.job_id)

    def cache_key(self) -> str:
        return f"{self.mode}:{','.join(sorted(self.providers))}"

    def provider(self, cloud: str):
        try:
            return self.providers[cloud]
        except KeyError:
            raise CloudConfigError(f"no {cloud} provider configured in this session", cloud=cloud) from None

    def address_of(self, info: InstanceInfo) -> str:
        """Where the instance's peers reach it: its private address inside one VPC, else its public one."""
        addr = (info.public_ip if self.public_addresses else None) or info.labels.get(LOCAL_ADDRESS_LABEL) \
            or info.private_ip
        if not addr:
            raise CloudConfigError(f"{info.instance_id} has no address yet", cloud=info.cloud)
        if self.public_addresses and not info.public_ip:
            raise CloudConfigError(f"{info.instance_id} has no public address, and its peers are outside its VPC",
                                   cloud=info.cloud)
        return addr

    def rendezvous_port(self, master: Assignment | None) -> int:
        if self.mode == "embedded" and self.network == "host":  # every "instance" shares this machine's ports
            return free_port()
        return RENDEZVOUS_PORT  # the port the job's security group / firewall rule opens

    def worker_args(self, a: Assignment | None) -> list[str]:
        # On the embedded cloud all ranks share this machine's cores: one thread each.
        return ["--threads", "1", "--timeout-s", "30"] if self.mode == "embedded" else []

    def worker_env(self, a: Assignment | None) -> dict[str, str]:
        env = {settings.FAULT_KILL_ENV: settings.fault_kill()} if settings.fault_kill() else {}
        env.update(settings.tracker_env())  # W&B / MLflow where the user asked (no secrets)
        if settings.fault_upload():
            env[settings.FAULT_UPLOAD_ENV] = settings.fault_upload()
        if self.mode != "embedded":
            return env
        # gloo's pairs listen on this interface's address: the one the peers can reach
        iface = "lo" if self.network == "host" else ("pub0" if self.public_addresses else "eth0")
        return {**env, "GLOO_SOCKET_IFNAME": iface, "OMP_NUM_THREADS": "1"}

    def startup_script(self, num_gpus: int = 1) -> str:
        """What every instance runs at boot: Sailor's wheel from the job's bucket, then the agent."""
        if self.code is None:
            self.code = upload_code(self.jobs_url)
        return startup_script(self.jobs_url, self.code, cloud="", num_gpus=num_gpus)

    def data_url(self, url: str) -> str:
        """A data file the instances can read: a local file is copied under the job's prefix once."""
        path = _local_path(url)
        if path is None:
            return url
        key = f"data/{path.name}"
        size = path.stat().st_size
        if self._staged.get(key) != size:  # once a session: each attempt's assignment asks again
            self._copy_up(key, path, open_storage(self.jobs_url))
            self._staged[key] = size
        return f"{self.jobs_url}/{key}"

    def folder_url(self, url: str) -> str:
        """A model folder the instances can read (``--init-from``): a local one is copied under the
        job's prefix once, file by file (the instances, confined as VMs, cannot reach this machine's
        files); a bucket URL is used as is."""
        root = _local_path(url) if url else None
        if root is None:
            return url
        prefix = f"inputs/{root.name}"
        files = sorted(p for p in root.rglob("*") if p.is_file())
        if self._staged.get(prefix) != len(files):  # once a session, as data_url
            store = open_storage(self.jobs_url)
            for path in files:
                self._copy_up(f"{prefix}/{path.relative_to(root).as_posix()}", path, store)
            self._staged[prefix] = len(files)
        return f"{self.jobs_url}/{prefix}"

    @staticmethod
    def _copy_up(key: str, path: Path, store) -> None:
        """``path``'s bytes at ``key`` unless an object of its size is there (a continued job's)."""
        if not store.exists(key) or store.size(key) != path.stat().st_size:
            store.put_atomic(key, path.read_bytes())

    def checkpoint_url(self, url: str) -> str:
        """Where the workers keep checkpoints: the job's own folder on this machine (the default)
        becomes its prefix in the bucket; another folder of this machine is refused, since the
        instances cannot reach it (on the embedded cloud neither, once they are confined as VMs)."""
        if url and not local_checkpoint_problem(url):
            return url
        if not url or not self.home_url or url.rstrip("/") == f"{self.home_url.rstrip('/')}/checkpoints":
            return f"{self.jobs_url}/checkpoints"
        raise CloudConfigError(f"--checkpoint-url {url}: {local_checkpoint_problem(url)} "
                               f"({self.jobs_url}/checkpoints)")

    def terminate(self, instance_ids: Sequence[str]) -> list[str]:
        ended: list[str] = []
        for provider in self.providers.values():
            ended += provider.terminate_instances(self.labels, instance_ids=list(instance_ids))
        return ended

    def boot_failures(self, instance_ids: Sequence[str]) -> dict[str, str]:
        """What went wrong on instances whose startup script reported a failed boot (wheel, install,
        GPU, version), in words with their log tails; such an instance is failed, not slow."""
        found = [read_boot_report(self.jobs_url, iid) for iid in instance_ids]
        return {r.instance_id: r.describe() for r in found if r is not None}

    def meet(self, infos: Sequence[InstanceInfo]) -> None:
        """Decide how this attempt's instances reach each other, and open the job's rules to match:
        inside one VPC by private address (the job's group/tag rule), else by public address, with
        each cloud's rule opened to exactly the peers' public addresses."""
        vpcs = {_vpc_of(i) for i in infos}
        self.public_addresses = len(vpcs) > 1
        peers = sorted(f"{i.public_ip}/32" for i in infos if i.public_ip) if self.public_addresses else []
        for provider in self.providers.values():
            if provider.supports(Feature.JOB_NETWORK):
                provider.set_job_peers(self.job_id, peers)

    def query(self) -> list[InstanceInfo]:
        out: list[InstanceInfo] = []
        for p in self.providers.values():
            out += p.query_instances(self.labels)
        return out

    def instance_states(self, ids: Sequence[str]) -> dict[str, str | None]:
        seen = {i.instance_id: i.state for i in self.query()}
        return {i: seen.get(i) for i in ids}

    def preempt(self, instance_id: str) -> bool:
        """Inject a spot preemption (notice, SIGTERM, notice period, SIGKILL) on the embedded cloud.

        False when the cloud has no such live instance (gone, or already being preempted);
        CloudConfigError when no embedded cloud is there to ask.
        """
        if self.control_url is None:
            raise CloudConfigError("preemptions can only be injected on the embedded cloud")
        answer = post_preemption(self.control_url, instance_id, secret=self.control_secret)
        if answer.ok:
            return True
        if answer.http_status == 404:
            return False
        raise CloudConfigError(f"the embedded cloud could not preempt {instance_id}: {answer.error}")


def _vpc_of(info: InstanceInfo) -> tuple[str, str]:
    """The private network an instance joins: per region (AWS's default VPCs) or one per cloud (GCP's)."""
    return (info.cloud, cloud_facts(info.cloud).network_of(parse_zone(info.zone).region))


def _local_path(url: str) -> Path | None:
    """This machine's path a ``--data`` or ``--init-from`` value names; None for a bucket URL."""
    if "://" in url and not url.startswith("file://"):
        return None
    return Path(url[len("file://"):] if url.startswith("file://") else url)
