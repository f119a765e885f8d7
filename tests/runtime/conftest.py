from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from sailor_core.plan.types import plan_from_dict


def make_plan(model: str, stages: list[tuple[int, int, list[int]]], *, gbs: int = 8, mbs: int = 2):
    """stages: (layer_start, layer_end, [tp degree of each replica])."""
    return plan_from_dict({
        "model": model, "global_batch_size": gbs, "micro_batch_size": mbs,
        "stages": [{"layers": [a, b], "replicas": [{"gpu": "cpu", "tp": t} for t in tps]}
                   for a, b, tps in stages],
    })


def sigterm_rank_after_step(rank: int, step: int):
    """launch_local's on_started: SIGTERM one worker (as the cloud does) once rank 0 logged ``step``."""
    def on_started(procs, metrics_path):
        def watch():
            while procs[rank].poll() is None:
                try:
                    lines = metrics_path.read_text().splitlines()
                except OSError:
                    lines = []
                if any(json.loads(l).get("step", 0) >= step for l in lines if l.strip()):
                    os.kill(procs[rank].pid, signal.SIGTERM)
                    return
                time.sleep(0.02)
        threading.Thread(target=watch, daemon=True).start()
    return on_started


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    from sailor_core.runtime.data import generate_corpus

    return generate_corpus(tmp_path_factory.mktemp("data") / "corpus.npy", vocab_size=512,
                           num_tokens=60_000, seed=1)
