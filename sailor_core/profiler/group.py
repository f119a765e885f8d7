"""Running a profiling job as a group of local processes (env:// rendezvous on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from sailor_core.errors import ProfileError
from sailor_core.ports import free_port


def run_local_group(argv: list[str], *, num_ranks: int, threads: int, timeout_s: float, what: str,
                    progress: Callable[[dict], None] | None = None, all_ranks_must_succeed: bool = True,
                    workdir_prefix: str = "sailor-profile-") -> dict:
    """Start ``num_ranks`` copies of ``argv``; return the ``result`` that rank 0 prints as a JSON line.

    Rank 0's other JSON lines go to ``progress``; every rank's stderr goes to a log file whose
    last line names the failure.  Processes still alive at the deadline are killed.
    """
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix=workdir_prefix))
    procs = []
    for rank in range(num_ranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(num_ranks), LOCAL_RANK=str(rank), OMP_NUM_THREADS=str(threads))
        log = open(workdir / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen(argv, env=env,
                                       stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                                       stderr=log, text=True, start_new_session=True), log))
    result = None
    deadline = time.monotonic() + timeout_s
    try:
        for line in procs[0][0].stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if msg.get("event") == "result":
                result = msg["result"]
            elif progress:
                progress(msg)
            if time.monotonic() > deadline:
                break
        for p, _ in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    failed = all_ranks_must_succeed and any(p.returncode != 0 for p, _ in procs)
    if result is None or failed:
        tail = (workdir / "rank0.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise ProfileError(f"{what} processes failed: {tail[0]}")
    return result
