"""The state handed over at a plan change is metered where it crosses zones (runtime/handover.py
sends through runtime/links.py): real gloo ranks in three zones, the meter against every byte the
backend was actually given; a receiver with a holder in its own zone takes its state from it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sailor_core.ports import free_port

from .handover_egress_ranks import GENERATIONS


@pytest.mark.slow  # four processes importing torch: ~30 s on the shared 2 cores
def test_handover_bytes_across_zones_are_metered_as_sent(corpus, tmp_path: Path):
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=dt.timedelta(seconds=90))
    script = Path(__file__).with_name("handover_egress_ranks.py")
    num = len(GENERATIONS[-1])
    procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(corpus), str(tmp_path / "ck"),
                               str(tmp_path / f"out{i}.json")], cwd=Path(__file__).parents[2],
                              stderr=subprocess.PIPE, text=True) for i in range(num)]
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
        del store
    assert [p.returncode for p in procs] == [0] * num, "\n".join(e[-3000:] for e in errors)
    got = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(num)]
    zones = got[0]["zones"]
    assert [r["state_from"] for r in got] == ["memory", "memory", "peers", "peers"]
    across, within = {}, 0
    for r in got:
        for dst, n in r["sent"].items():
            if zones[int(dst)] != zones[r["rank"]]:
                key = (zones[r["rank"]], zones[int(dst)])
                across[key] = across.get(key, 0) + n
            else:
                within += n
        for dst_zone, n in r["metered"].items():
            across[(zones[r["rank"]], dst_zone)] = across.get((zones[r["rank"]], dst_zone), 0) - n
    # the meter counted every byte that crossed zones, and nothing else
    assert across and all(n == 0 for n in across.values()), across
    metered = {(zones[r["rank"]], d): n for r in got for d, n in r["metered"].items()}
    # the new rank in B took its state from B's holder (no egress); C's, from a holder in A or B
    assert set(metered) <= {(zones[0], zones[3]), (zones[1], zones[3])} and metered and within > 0
