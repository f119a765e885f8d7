"""``python -m infra.local.daemon``: the embedded cloud as a standalone process.

Writes ``$SAILOR_HOME/cloud.json`` (pid, endpoints) once it serves, removes it on
SIGTERM/SIGINT or ``POST <control_url>/shutdown``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from infra.config import buckets_dir, runs_dir, state_file
from infra.local.cloud import PROJECT, EmbeddedCloud
from infra.local.faults import parse_fault_rates
from infra.local.machines import reap_dead_runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.local.daemon")
    ap.add_argument("--notice-s", type=float, default=2.0)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--faults", default="", help="e.g. throttle=0.1,server_error=0.05,seed=1")
    ap.add_argument("--keep-ended-disks", action="store_true",
                    help="keep ended instances' folders until the cloud stops (audits; removed at once otherwise)")
    args = ap.parse_args(argv)

    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    reap_dead_runs(runs_dir())
    cloud = EmbeddedCloud(state_dir=runs_dir() / str(os.getpid()), buckets_dir=buckets_dir(), notice_s=args.notice_s,
                          faults=parse_fault_rates(args.faults))
    cloud.keep_ended_disks = args.keep_ended_disks
    cloud.start()
    if args.trace:
        cloud.play_trace(args.trace, time_scale=args.time_scale)
    state = {
        "pid": os.getpid(),
        "aws_endpoint": cloud.aws_endpoint,
        "gce_endpoint": cloud.gce_endpoint,
        "gcs_endpoint": cloud.gcs_endpoint,
        "control_url": f"{cloud.gce_endpoint}/sailor",
        "control_secret_file": str(cloud.control_secret_file),  # 0600: the secret itself is never in this file
        "metadata_url": f"{cloud.gce_endpoint}/metadata",
        "project": PROJECT,
        "network": cloud.network.mode,
        "metadata_tells_instances_apart": cloud.network.enforced,
        "aws_keys": list(cloud.aws_keys),  # the embedded account's administrator: hence the file's 0600
        "state_dir": str(cloud.state_dir),
        "started_at": time.time(),
    }
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(json.dumps(state, indent=2))
    tmp.replace(path)

    def stop(*_):
        cloud.shutdown_requested.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps({k: v for k, v in state.items() if k != "aws_keys"}), flush=True)
    try:
        cloud.shutdown_requested.wait()
    finally:
        cloud.stop()
        try:
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
