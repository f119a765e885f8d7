"""Runs a test's rank script (``handover_ranks.py``, ``handover_egress_ranks.py``) as real processes:
each is started as ``script INDEX PORT CORPUS CKPT_DIR OUT.json`` and meets the others through one
TCPStore this process holds."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

from sailor_core.ports import free_port


def run_rank_scripts(script: str, num: int, corpus, tmp_path: Path) -> list:
    """Run ``num`` processes of ``script`` (a file next to this one), assert every one exits 0, and
    return what each wrote to its OUT.json, by index."""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=dt.timedelta(seconds=90))
    path = Path(__file__).with_name(script)
    procs = [subprocess.Popen([sys.executable, str(path), str(i), str(port), str(corpus), str(tmp_path / "ck"),
                               str(tmp_path / f"out{i}.json")], cwd=Path(__file__).parents[2],
                              stderr=subprocess.PIPE, text=True) for i in range(num)]
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
        del store
    assert [p.returncode for p in procs] == [0] * num, "\n".join(e[-3000:] for e in errors)
    return [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(num)]
