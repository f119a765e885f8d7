"""Figures of the embedded cloud and the providers: start-up, listing, launch, preemption, failover.

    .venv/bin/python benchmarks/clouds_bench.py [--repeat N]

Prints one line per figure (median over N runs where repeated).
"""

from __future__ import annotations

import argparse
import statistics
import time

t_import = time.perf_counter()
from infra.local.cloud import EmbeddedCloud  # noqa: E402
from infra.local.faults import FaultRates  # noqa: E402
from infra.provisioner import GpuNeed, Provisioner  # noqa: E402
from infra.records import PREEMPTED, job_labels  # noqa: E402
from infra.retry import RetryPolicy  # noqa: E402

IMPORT_S = time.perf_counter() - t_import
CASES = {"aws": ("us-east-1a", "g4dn.xlarge"), "gcp": ("us-central1-a", "n1-standard-4-t4x1")}


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"import infra (boto3, moto, google-cloud-compute): {IMPORT_S:.2f} s")
    start_s, cloud = timed(lambda: EmbeddedCloud(notice_s=2.0, tick_s=0.1).start())
    print(f"embedded cloud start (both servers, after imports): {start_s * 1e3:.0f} ms")
    providers = cloud.providers(retry=RetryPolicy(base_delay_s=0.05, max_delay_s=0.5))
    try:
        for name, p in providers.items():
            first, offers = timed(lambda: p.list_offers())
            again = statistics.median(timed(lambda: p.list_offers())[0] for _ in range(args.repeat))
            print(f"{name} list_offers, all catalog regions: {len(offers)} offers, first {first:.2f} s, then median {again:.2f} s")

        for name, (zone, itype) in CASES.items():
            p = providers[name]
            runs = []
            for k in range(args.repeat):
                labels = job_labels(f"bench-{name}", k)

                def launch():
                    p.run_instances(zone=zone, instance_type=itype, count=1, labels=labels, startup_script="sleep 600")
                    return p.wait_instances(labels, timeout_s=30, poll_s=0.05)

                runs.append(timed(launch)[0])
            print(f"{name} run_instances + wait running (1 x {itype}): median {statistics.median(runs) * 1e3:.0f} ms "
                  f"over {len(runs)}")
            pre = []
            for k in range(args.repeat):
                labels = job_labels(f"bench-{name}", k)
                (inst,) = p.query_instances(labels, include_ended=False)
                t = time.perf_counter()
                cloud.preempt(inst.instance_id)
                while [i.state for i in p.query_instances(labels)] != [PREEMPTED]:
                    time.sleep(0.05)
                pre.append(time.perf_counter() - t)
            print(f"{name} preempt -> seen PREEMPTED by query (notice 2.0 s): median {statistics.median(pre):.2f} s")
            p.terminate_instances(job_labels(f"bench-{name}"))

        prov = Provisioner(providers)
        zones = ["us-central1-a", "europe-west4-a", "us-east-1a"]
        offers = [o for o in prov.offers(["T4"], zones=zones) if o.gpus_per_node == 1]
        cloud.set_capacity("T4", "us-central1-a", 0)
        fail_s, result = timed(lambda: prov.provision([GpuNeed(gpu="T4", zone=None, num_gpus=2)], job_id="bench-fo",
                                                      offers=offers))
        print(f"provision 2 x T4, cheapest zone out of capacity: {fail_s * 1e3:.0f} ms, "
              f"history {result.history_lines()}")
        prov.teardown("bench-fo")

        gcp = providers["gcp"]
        for rate in (0.0, 0.2):
            cloud.set_faults(FaultRates(throttle=rate, seed=1))
            gcp.num_retries = 0
            n = 20
            s, _ = timed(lambda: [gcp.query_instances(job_labels("bench-x")) for _ in range(n)])
            print(f"gcp query_instances with {rate:.0%} throttling: {s / n * 1e3:.0f} ms per call, "
                  f"{gcp.num_retries} retries over {n} calls")
        cloud.set_faults(FaultRates())
    finally:
        cloud.stop()


if __name__ == "__main__":
    main()
