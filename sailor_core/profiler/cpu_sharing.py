"""Ranks of a plan that share one machine's CPU cores: the iteration time the simulator's parts imply.

The simulator (``sailor_core.simulator.simulate``) gives every replica its own device.  Local CPU
"replicas" are processes with ``threads_per_rank`` intra-op threads each, on ``C`` cores; when
there are more runnable threads than cores they share them.  First principles, no fitted constant:

* every rank's CPU work per iteration is what the simulator already charges it: its micro-batches'
  forward + backward (measured profile), its optimizer update, and, for a stage with replicas, the
  gradient all-reduce (over loopback the "network" is the same CPUs copying and adding);
* the cores are work-conserving and 1F1B keeps them busy (while a stage waits for its peer, the
  peer's stage computes), so the iteration takes at least ``total work / effective cores``;
* gradient all-reduce: the simulator's (ring over the p2p curve), or, when given, the measured
  CPU seconds of an all-reduce of the same group size (``NetworkProfile.allreduce_cpu_s``): gloo
  between local processes reduces and copies on the same CPUs;
* other jobs on the machine: with ``L`` other runnable threads, the scheduler shares the cores
  fairly, so our ``R`` threads get ``C R / (R + L)`` of them (``probe_other_load`` measures L).

    T = max(T_simulator, W / C_eff)

This module imports nothing heavy (no torch); it reads a ``SimResult``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from sailor_core.plan.types import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedCpuTime:
    iteration_time_s: float  # max(simulated, work / effective cores)
    simulated_s: float  # the simulator's, every rank on its own core
    work_s: float  # CPU seconds of all ranks' work per iteration
    effective_cores: float
    cpu_sharing_s: float  # what sharing adds to the simulated time

    def to_dict(self) -> dict:
        return {"iteration_time_s": self.iteration_time_s, "simulated_s": self.simulated_s, "work_s": self.work_s,
                "effective_cores": self.effective_cores, "cpu_sharing_s": self.cpu_sharing_s}


def effective_cores(num_cores: float, busy_threads: int, other_load: float = 0.0) -> float:
    """Cores our ``busy_threads`` get next to ``other_load`` runnable threads of other jobs."""
    if busy_threads + other_load <= num_cores:
        return float(min(num_cores, busy_threads))
    return num_cores * busy_threads / (busy_threads + other_load)


def _sync_s(stage, allreduce_s=None) -> float:
    dp = len(stage.replicas)
    if dp <= 1:
        return 0.0
    measured = allreduce_s(stage.dp_sync_bytes, dp) if allreduce_s is not None else None
    return stage.dp_sync_s if measured is None else measured


def rank_work_s(sim, allreduce_s=None) -> float:
    """CPU seconds of all ranks' work in one iteration (see the module doc); ``allreduce_s(bytes,
    ranks)`` the measured CPU seconds of one rank's all-reduce (None where not measured)
    replacing the simulator's all-reduce time."""
    work = 0.0
    for stage in sim.stages:
        sync = _sync_s(stage, allreduce_s)
        for rep in stage.replicas:
            work += (rep.num_microbatches * (rep.fwd_s + rep.bwd_s) + rep.update_s + sync) * rep.tp_degree
    return work


def shared_cpu_time(plan: Plan, sim, *, num_cores: float | None = None, threads_per_rank: int = 1,
                    other_load: float = 0.0, allreduce_s=None, allreduce_cpu_s=None) -> SharedCpuTime:
    """Iteration time of ``plan`` (simulated as ``sim``) when all its ranks share ``num_cores``.

    ``allreduce_s`` / ``allreduce_cpu_s`` (``NetworkProfile.allreduce_time_s`` / ``allreduce_cpu_s``):
    measured wall time (critical path) and CPU seconds (work) of an all-reduce, where measured."""
    cores = float(num_cores or os.cpu_count() or 1)
    ranks = sum(rep.tp_degree for s in plan.stages for rep in s.replicas)
    eff = effective_cores(cores, ranks * threads_per_rank, other_load)
    work = rank_work_s(sim, allreduce_cpu_s or allreduce_s)
    # the simulator's own time with its slowest stage's sync + update replaced by the measured sync
    tail = max(_sync_s(s, allreduce_s) + s.update_s for s in sim.stages)
    simulated = sim.iteration_time_s - sim.breakdown["dp_sync"] - sim.breakdown["update"] + tail
    t = max(simulated, work / eff)
    return SharedCpuTime(iteration_time_s=t, simulated_s=simulated, work_s=work, effective_cores=eff,
                         cpu_sharing_s=t - simulated)


_SPIN = "import time,sys\nw=time.perf_counter()+float(sys.argv[1]);c=time.process_time()\n" \
        "while time.perf_counter()<w: pass\nprint(time.process_time()-c)"


def probe_other_load(seconds: float = 1.0, num_cores: int | None = None) -> float:
    """Runnable threads of other jobs, measured: ``C`` spinning processes each get ``C / (C + L)``
    of a core, so ``L = C / share - C`` (0 on an idle machine)."""
    cores = num_cores or os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)], stdout=subprocess.PIPE, text=True)
             for _ in range(cores)]
    t0 = time.perf_counter()
    shares = [float(p.communicate()[0]) / seconds for p in procs]
    del t0
    share = min(1.0, sum(shares) / len(shares))
    return max(0.0, cores / share - cores) if share > 0 else float("inf")
