"""The embedded cloud's namespace names: a new cloud never takes a name a live cloud or a crashed
one's leftover namespaces hold, and a cloud file is stale once its process is gone, even when
the pid has been reused since."""

from __future__ import annotations

import os

from infra.local import network


def test_a_new_tag_avoids_live_clouds_and_leftover_namespaces(monkeypatch):
    prefix = f"{os.getpid() % 0xFFFF:04x}"
    draws = iter([7, 7, 8, 9])
    monkeypatch.setattr(network.random, "randrange", lambda n: next(draws))
    # 07: a live cloud's file; 08: a crashed cloud's namespaces, its file gone; 09 is free
    tag = network._free_tag({f"{prefix}07"}, [f"sl{prefix}08i", f"sl{prefix}08-3", "other"])
    assert tag == f"{prefix}09"


def test_a_cloud_file_is_stale_when_its_process_is_gone_or_was_another():
    me = os.getpid()
    started = network._start_ticks(me)
    assert started.isdigit()
    assert network._owner_alive([str(me), "64", started])
    assert not network._owner_alive([str(me), "64", str(int(started) + 1)])  # the pid reused by us
    assert network._owner_alive([str(me), "64"])  # a file of the older format: the pid alone
    assert not network._owner_alive([]) and not network._owner_alive(["x"])
