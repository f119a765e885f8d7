"""Heartbeats through the rendezvous store, so survivors can name the rank that died.

Each rank's thread stamps ``sailor/hb/<rank>`` every ``period_s`` on its own
client connection to the job's TCPStore (hosted by rank 0).  When a collective
fails, a survivor samples the stamps twice, ``2.5 * period_s`` apart: ranks whose
stamp did not move and that did not leave an exit note are the dead ones.
Survivors leave an exit note before exiting so a cascade is not mistaken for
deaths.  This needs the store to outlive any one worker: ``launch_local`` (like
torchrun's agent) hosts it and sets ``TORCHELASTIC_USE_AGENT_STORE=True``; where
rank 0 hosts it instead, a survivor that finds it gone reports "unknown".
"""

from __future__ import annotations

import threading
import time
import urllib.request
from datetime import timedelta

import torch.distributed as dist


class Heartbeat:
    def __init__(self, rank: int, world: int, host: str, port: int, period_s: float = 0.5, *,
                 prefix: str = "") -> None:
        self.rank, self.world, self.period_s = rank, world, period_s
        self._stop = threading.Event()
        self.store = dist.PrefixStore(prefix, dist.TCPStore(host, port, world, is_master=False,
                                                            timeout=timedelta(seconds=10), wait_for_workers=False))
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sailor-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        self._beat()
        self._thread.start()
        return self

    def _beat(self) -> None:
        with self._lock:
            self.store.set(f"sailor/hb/{self.rank}", repr(time.time()))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._beat()
            except Exception:  # the store host is gone (or closed); the main thread will find out
                return

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Stop beating and drop the store connection: a parked worker keeps no client of a store
        it no longer uses (one left connected kept a store's port bound in a test)."""
        self.stop()
        self._thread.join()
        with self._lock:
            self.store = None

    def note_exit(self, reason: str) -> None:
        try:
            with self._lock:
                self.store.set(f"sailor/exit/{self.rank}", reason)
        except Exception:
            pass

    def dead_ranks(self) -> list[int] | None:
        """Ranks that stopped beating without an exit note; None if the store is unreachable."""
        try:
            first = self._stamps()
            time.sleep(2.5 * self.period_s)
            second = self._stamps()
            with self._lock:
                noted = {r for r in range(self.world) if self.store.check([f"sailor/exit/{r}"])}
        except Exception:
            return None
        return [r for r in range(self.world)
                if r != self.rank and first.get(r) == second.get(r) and r not in noted]

    def _stamps(self) -> dict[int, str]:
        with self._lock:
            return {r: self.store.get(f"sailor/hb/{r}").decode()
                    for r in range(self.world) if self.store.check([f"sailor/hb/{r}"])}


def watch_preempt_url(url: str, on_notice, period_s: float = 1.0) -> threading.Thread:
    """Poll a preemption-notice URL (e.g. a cloud metadata endpoint); a 200 with a body is a notice."""
    def run() -> None:
        while True:
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status == 200 and resp.read().strip():
                        on_notice()
                        return
            except Exception:
                pass  # 404 / unreachable: no notice yet
            time.sleep(period_s)

    t = threading.Thread(target=run, name="sailor-preempt-url", daemon=True)
    t.start()
    return t
