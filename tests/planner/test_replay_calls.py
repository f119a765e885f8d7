"""The planner answers a cold replay's requests exactly as commit 60137dd did (same plans,
figures, evaluation counts and exhausted flags), with its process-level memos warming up from
request to request as in a replay.  The requests and the reference answers' digests are
recorded by ``benchmarks/bench_planner_replay_calls.py`` (which also times all of them)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_planner_replay_calls as bench  # noqa: E402


def test_replay_requests_get_the_reference_answers_in_order():
    data = bench.load()
    checked = 0
    for name, count in (("aws-3d", 12), ("gcp-4d", 6)):
        calls, digests = data[name]["calls"][:count], data[name]["answer_sha256"][:count]
        # Both one-type requests and two-type ones (a type's pools unchanged from the request
        # before: what the process memos share) are among them.
        assert {len({g for g, _, _ in c}) for c in calls} == {1, 2}
        for i, (available, want) in enumerate(zip(calls, digests)):
            assert bench.digest(bench.answer(available)) == want, f"{name} request #{i}"
            checked += 1
    assert checked == 18


def test_digest_notices_a_changed_figure():
    ans = bench.answer(bench.load()["aws-3d"]["calls"][0])
    throughput = ans["cands"][0][0]
    changed = {**ans, "cands": [[throughput * (1 + 1e-15), *ans["cands"][0][1:]], *ans["cands"][1:]]}
    assert bench.digest(changed) != bench.digest(ans)


# every request of both traces (~30 s on 2 cores, idle): a change to a late request (aws-3d #430 moved
# unseen once) shows here; the default run checks the first 18 above
@pytest.mark.slow
def test_every_replay_request_gets_its_reference_answer():
    for name in ("aws-3d", "gcp-4d"):
        res = bench.run_once(name, six=False)
        assert res["num_calls"] == len(bench.load()[name]["calls"]) > 0
        assert res["differences"] == [], f"{name}: requests {res['differences'][:20]} answer differently"
