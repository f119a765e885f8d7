"""What confining an embedded instance costs at boot: a machine started, its script running the
image's Python once, to its exit; unconfined and confined interleaved (infra/local/confine.py).

    .venv/bin/python benchmarks/bench_confine.py [--boots 8] [--rounds 2]

Needs root with namespaces (the confined half).  Prints the median and least per round and mode.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from infra.local.image import image_for_this_machine
from infra.local.machines import Machines

SCRIPT = '#!/bin/bash\n"$SAILOR_PYTHON" -c "import sys"\n'


def boot_times(image, *, confined: bool, boots: int) -> list[float]:
    folder = Path(tempfile.mkdtemp(prefix="bench-confine-"))
    try:
        machines = Machines(folder, image=image, confined=confined)
        times = []
        for i in range(boots):
            start = time.perf_counter()
            machine = machines.boot(instance_id=f"i-{i}", cloud="aws", zone="us-east-1a", script=SCRIPT)
            machine.process.wait()
            times.append(time.perf_counter() - start)
            assert machine.process.returncode == 0, (machine.directory / "console.log").read_text()
        return times
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boots", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    image = image_for_this_machine()
    for r in range(args.rounds):
        for confined in (False, True):
            times = boot_times(image, confined=confined, boots=args.boots)
            print(f"round {r + 1} {'confined' if confined else 'unconfined':>10}: boot to exit median "
                  f"{statistics.median(times):.3f} s, least {min(times):.3f} s ({args.boots} boots)")


if __name__ == "__main__":
    main()
