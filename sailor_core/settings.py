"""Sailor's environment variables: the one module that reads ``SAILOR_*`` (stdlib only).

Each variable has a name constant (``*_ENV``) and one small accessor that reads it at call
time, never at import time: tests and the CLI change the environment of a running process.
Code that builds a child's environment (an instance's, a worker's) writes the names from
these constants; code that reads a variable calls its accessor.  "Set by" says who is meant
to set a variable: the user, the embedded cloud (for each instance it starts), the agent (for
the workers it starts), or tests.  Variables outside Sailor's namespace (``AWS_*`` for the
S3 storage, ``MASTER_ADDR``/``RANK``/... of torch's rendezvous, ``PREFECT_*``) are read where
they are used, by the rules of their owners.
"""

from __future__ import annotations

import os
from pathlib import Path

# ---- where Sailor keeps its files (set by the user) -------------------------------------

HOME_ENV = "SAILOR_HOME"
JOBS_URL_ENV = "SAILOR_JOBS_URL"


def sailor_home() -> Path:
    """``SAILOR_HOME``: root of Sailor's local files (jobs, profiles, network fits, the Prefect
    server's database, the standalone embedded cloud's state).  Default ``~/.sailor``."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".sailor"


def jobs_url() -> str:
    """``SAILOR_JOBS_URL``: where job states and agent documents live (a path, ``file://`` or
    ``s3://`` URL; on real clouds an object store the instances reach).  Default
    ``$SAILOR_HOME/jobs``."""
    return os.environ.get(JOBS_URL_ENV) or str(sailor_home() / "jobs")


JOB_LEASE_S_ENV = "SAILOR_JOB_LEASE_S"


def job_lease_s(default_s: float) -> float:
    """``SAILOR_JOB_LEASE_S``: how long a dead controller's job waits before another flow run may
    take it over (``sailor_core.job.lease``); renewed every quarter of it."""
    value = os.environ.get(JOB_LEASE_S_ENV)
    return float(value) if value else default_s


# ---- which clouds (set by the user) -----------------------------------------------------

CLOUDS_ENV = "SAILOR_CLOUDS"
AWS_REGIONS_ENV = "SAILOR_AWS_REGIONS"
AWS_AMI_ENV = "SAILOR_AWS_AMI"
GCP_PROJECT_ENV = "SAILOR_GCP_PROJECT"
GCP_ZONES_ENV = "SAILOR_GCP_ZONES"
S3_KMS_KEY_ENV = "SAILOR_S3_KMS_KEY"
GCP_SERVICE_ACCOUNT_ENV = "SAILOR_GCP_SERVICE_ACCOUNT"
EMBEDDED_NETWORK_ENV = "SAILOR_EMBEDDED_NETWORK"
EMBEDDED_CONFINE_ENV = "SAILOR_EMBEDDED_CONFINE"


def clouds() -> str:
    """``SAILOR_CLOUDS``, stripped and lower-cased: ``embedded`` (default), ``real``/``all``, or a
    comma-separated list of ``aws``, ``gcp``.  Real clouds are used only when this asks for
    them (``infra.config.real_clouds`` interprets it)."""
    return os.environ.get(CLOUDS_ENV, "embedded").strip().lower()


def _csv(name: str) -> list[str]:
    return [part for part in os.environ.get(name, "").split(",") if part]


def aws_regions() -> list[str]:
    """``SAILOR_AWS_REGIONS``: comma-separated regions the AWS provider uses; empty: its default."""
    return _csv(AWS_REGIONS_ENV)


def aws_ami() -> str | None:
    """``SAILOR_AWS_AMI``: the machine image real AWS instances boot (must hold Sailor and torch)."""
    return os.environ.get(AWS_AMI_ENV)


def gcp_project() -> str | None:
    """``SAILOR_GCP_PROJECT``: the GCP project; unset: gcloud's default project."""
    return os.environ.get(GCP_PROJECT_ENV)


def gcp_zones() -> list[str]:
    """``SAILOR_GCP_ZONES``: comma-separated zones the GCP provider uses; empty: its default."""
    return _csv(GCP_ZONES_ENV)


def s3_kms_key() -> str | None:
    """``SAILOR_S3_KMS_KEY``: KMS key of the buckets Sailor creates (SSE-KMS); unset: SSE-S3."""
    return os.environ.get(S3_KMS_KEY_ENV)


def gcp_service_account() -> str | None:
    """``SAILOR_GCP_SERVICE_ACCOUNT``: the email of the service account GCE instances launched outside
    a job's identity run as (optional: a job's instances run as the job's own account, which
    Sailor makes, ``infra/gcp_identity.py``).  The embedded cloud uses
    ``sailor-instances@sailor-local.iam.gserviceaccount.com``."""
    return os.environ.get(GCP_SERVICE_ACCOUNT_ENV) or None


def embedded_network() -> str:
    """``SAILOR_EMBEDDED_NETWORK``: how the embedded cloud wires its instances: ``netns`` (each in
    its own network namespace with its own addresses, the job's security group / firewall rules
    applied there with nftables; needs root and nft), ``host`` (all on 127.0.0.1, rules recorded
    but not enforced), or ``auto`` (default: ``netns`` when root with ``ip`` and ``nft``, else
    ``host``, with a warning)."""
    return os.environ.get(EMBEDDED_NETWORK_ENV, "auto").strip().lower() or "auto"


def embedded_confine() -> str:
    """``SAILOR_EMBEDDED_CONFINE``: how the embedded cloud confines its instances' processes:
    ``on`` (each instance as its own unprivileged user in its own PID and mount namespaces,
    seeing only its root, the read-only image and a few devices; needs root and namespaces),
    ``off`` (a process group of this user, as the instance's root directory and environment
    alone separate it), or ``auto`` (default: ``on`` where the machine allows it, else ``off``,
    with a warning)."""
    return os.environ.get(EMBEDDED_CONFINE_ENV, "auto").strip().lower() or "auto"


# ---- an instance's identity (set by the embedded cloud for each instance it starts) ------

INSTANCE_ID_ENV = "SAILOR_INSTANCE_ID"
ZONE_ENV = "SAILOR_ZONE"
CLOUD_ENV = "SAILOR_CLOUD"
PRIVATE_IP_ENV = "SAILOR_PRIVATE_IP"
INSTANCE_DIR_ENV = "SAILOR_INSTANCE_DIR"
METADATA_DIR_ENV = "SAILOR_METADATA_DIR"
METADATA_URL_ENV = "SAILOR_METADATA_URL"
PYTHON_ENV = "SAILOR_PYTHON"  # read by the startup script (shell): the image's Python, which boots the agent
# Read by the startup script's boot program (infra/instance_boot.py, which runs before Sailor is
# installed and so reads them itself): where wheel environments are kept (default
# /opt/sailor/envs; the embedded cloud sets a cache shared by its instances), and the boot's
# configuration (written by the startup script itself).
ENV_CACHE_ENV = "SAILOR_ENV_CACHE"
# Set by the embedded cloud for each instance: its GPUs ("N NAME"), which the image's nvidia-smi stand-in lists.
EMBEDDED_GPUS_ENV = "SAILOR_EMBEDDED_GPUS"
BOOT_CONFIG_ENV = "SAILOR_BOOT_CONFIG"


def instance_id() -> str | None:
    """``SAILOR_INSTANCE_ID``: this instance's id (the agent's default ``--instance-id``)."""
    return os.environ.get(INSTANCE_ID_ENV)


def instance_cloud() -> str | None:
    """``SAILOR_CLOUD``: ``aws`` or ``gcp``, the cloud this instance runs on (which metadata
    server to poll for a preemption notice)."""
    return os.environ.get(CLOUD_ENV)


def instance_dir() -> Path | None:
    """``SAILOR_INSTANCE_DIR``: the embedded instance's own directory (the agent works under it)."""
    value = os.environ.get(INSTANCE_DIR_ENV)
    return Path(value) if value else None


def metadata_url() -> str | None:
    """``SAILOR_METADATA_URL``: the embedded cloud's metadata server for this instance (the
    same paths as AWS IMDS / GCE metadata); unset on real clouds."""
    return os.environ.get(METADATA_URL_ENV)


# ---- the agent and its workers ----------------------------------------------------------

NOTICE_S_ENV = "SAILOR_NOTICE_S"
ATTEMPT_ENV = "SAILOR_ATTEMPT"  # set by the agent for its workers (the job's attempt), for their logs
GENERATION_ENV = "SAILOR_GENERATION"  # set by the agent for its workers (the assignment's generation)
PREEMPT_FILE_ENV = "SAILOR_PREEMPT_FILE"
PREEMPT_URL_ENV = "SAILOR_PREEMPT_URL"
STARTED_UNIX_S_ENV = "SAILOR_STARTED_UNIX_S"  # set by the agent: when it started or handed over the worker
AGENT_PID_ENV = "SAILOR_AGENT_PID"  # set by the agent: its pid, which a parked worker outlives by no more than a poll
SAVE_NOTE_ENV = "SAILOR_SAVE_NOTE"  # set by the agent: where a stopping worker notes its saves' progress
DEFAULT_NOTICE_S = 30.0


def notice_s() -> float:
    """``SAILOR_NOTICE_S``: how long a preempted agent keeps forwarding its workers' reports
    before it stops them (the notice period of the cloud; tests shorten it).  Default 30 s."""
    return float(os.environ.get(NOTICE_S_ENV, str(DEFAULT_NOTICE_S)))


def preempt_file() -> str | None:
    """``SAILOR_PREEMPT_FILE``: a path whose appearance tells a worker it is being preempted
    (set by whoever starts the workers: launch_local, tests)."""
    return os.environ.get(PREEMPT_FILE_ENV)


def preempt_url() -> str | None:
    """``SAILOR_PREEMPT_URL``: a URL a worker polls; answering 200 means a preemption notice."""
    return os.environ.get(PREEMPT_URL_ENV) or None


def agent_pid() -> int | None:
    """``SAILOR_AGENT_PID``: the agent that started this worker; a parked worker exits once its
    parent is no longer that process (unset: the parent the worker started with)."""
    value = os.environ.get(AGENT_PID_ENV)
    return int(value) if value else None


def save_note_file() -> str | None:
    """``SAILOR_SAVE_NOTE``: the file where a worker notes its stop saves' progress for its agent
    (``runtime/save_note.py``; unset outside an agent: no note)."""
    return os.environ.get(SAVE_NOTE_ENV) or None


def attempt() -> int:
    """``SAILOR_ATTEMPT``: the job's attempt a worker belongs to (set by the agent; 0 outside a job)."""
    return int(os.environ.get(ATTEMPT_ENV, "0"))


def generation() -> int:
    """``SAILOR_GENERATION``: the agent's generation a worker runs (0 outside an agent); the
    rendezvous keys of each generation are apart, since a parked rank 0 hosts the store again."""
    return int(os.environ.get(GENERATION_ENV, "0"))


def started_unix_s() -> float | None:
    """``SAILOR_STARTED_UNIX_S``: when the agent started this worker or handed it the current
    generation (Unix seconds); the worker reports how long it took to be ready to train."""
    value = os.environ.get(STARTED_UNIX_S_ENV)
    return float(value) if value else None


# ---- fault injection (set by tests and the chaos harness only) ---------------------------

FAULT_KILL_ENV = "SAILOR_FAULT_KILL"
FAULT_UPLOAD_ENV = "SAILOR_FAULT_UPLOAD"


def fault_kill() -> str:
    """``SAILOR_FAULT_KILL``: ``RANK:STEP`` SIGKILLs that worker rank in the middle of that step,
    ``RANK:STEP:save`` after it wrote its layer files of that step's checkpoint but before the
    manifest.  Default ``""``: no fault."""
    return os.environ.get(FAULT_KILL_ENV, "")


def fault_upload() -> str | None:
    """``SAILOR_FAULT_UPLOAD``: path of a JSON file (``{"delay_s": x}`` or ``{"fail": true}``) the
    first checkpoint upload that sees it claims and applies (``{"delay_s": x, "every": true}``:
    every upload waits, a slow store)."""
    return os.environ.get(FAULT_UPLOAD_ENV)


LINK_SHIM_ENV = "SAILOR_LINK_SHIM"
COMPUTE_PACE_ENV = "SAILOR_COMPUTE_PACE"


def link_shim() -> str:
    """``SAILOR_LINK_SHIM``: ``LATENCY_S:BYTES_PER_S`` makes the engine's point-to-point transfers
    and data-parallel all-reduces last as long as over a link of that latency and bandwidth
    (``runtime/links.py``; set by tests and benchmarks only).  Default ``""``: real links."""
    return os.environ.get(LINK_SHIM_ENV, "")


def compute_pace() -> str:
    """``SAILOR_COMPUTE_PACE``: ``FWD_S:BWD_S`` makes each forward and backward of a micro-batch
    last at least that many seconds per layer of the stage (``runtime/links.py``'s ``ComputePace``;
    benchmarks only).  Default ``""``: compute as fast as it runs."""
    return os.environ.get(COMPUTE_PACE_ENV, "")


# ---- the command line (set by the user) -------------------------------------------------

DEBUG_ENV = "SAILOR_DEBUG"
PREFECT_EPHEMERAL_ENV = "SAILOR_PREFECT_EPHEMERAL"
FUZZ_EXAMPLES_ENV = "SAILOR_FUZZ_EXAMPLES"


def debug() -> bool:
    """``SAILOR_DEBUG``: any non-empty value shows tracebacks and Prefect's own failure reports."""
    return bool(os.environ.get(DEBUG_ENV))


def prefect_ephemeral() -> bool:
    """``SAILOR_PREFECT_EPHEMERAL``: any non-empty value makes the CLI use Prefect's temporary
    server instead of starting (or finding) ``sailor ui``'s."""
    return bool(os.environ.get(PREFECT_EPHEMERAL_ENV))


def fuzz_examples(default: int = 6) -> int:
    """``SAILOR_FUZZ_EXAMPLES``: examples per property of the bad-input fuzz tests (set by a
    developer for a deep run, e.g. 200)."""
    return int(os.environ.get(FUZZ_EXAMPLES_ENV, str(default)))


# ---- experiment trackers (set by the user; their owners' names) -------------------------

# Forwarded from the flow's environment to the workers (``tasks/cloud_session.worker_env``), so a
# job's rank 0 logs where the user asked; secrets (WANDB_API_KEY, MLflow's tokens) are not: they
# would be written into the job's storage with the assignment (set them on the instances).
TRACKER_ENVS = ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE", "WANDB_DIR", "WANDB_BASE_URL",
                "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE")


def tracker_env() -> dict[str, str]:
    """The experiment trackers' variables set here (``TRACKER_ENVS``), for a worker's environment."""
    return {name: os.environ[name] for name in TRACKER_ENVS if os.environ.get(name)}


def wandb_enabled() -> bool:
    """Weights & Biases is on when ``WANDB_PROJECT`` or ``WANDB_MODE`` is set (not ``disabled``)."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    return mode != "disabled" and bool(mode or os.environ.get("WANDB_PROJECT"))


def mlflow_tracking_uri() -> str | None:
    """MLflow is on when ``MLFLOW_TRACKING_URI`` is set (``file:///...`` for its file store)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or None
