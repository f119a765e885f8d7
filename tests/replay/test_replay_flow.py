"""The replay flow under Prefect's test harness: it runs and publishes its artifacts."""

import pytest

pytestmark = pytest.mark.slow


def test_replay_flow_publishes_summary_and_timeline(tmp_path):
    import sys

    from prefect.testing.utilities import prefect_test_harness

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from replay_helpers import linear_planner

    import sailor_core.replay.run as run_mod
    from flows.replay_flow import replay_flow

    trace = tmp_path / "t.csv"
    trace.write_text(",Timestamp,A100-40_us-central1-a,V100-16_us-central1-a\n0,0,4,4\n1,3600,2,4\n2,7200,4,4\n")
    original = run_mod.planner_plan_fn
    run_mod.planner_plan_fn = lambda **kw: linear_planner  # the real planner is covered elsewhere; keep it fast
    try:
        with prefect_test_harness():
            summary = replay_flow(trace=str(trace), model="opt-350m", tokens=2e9)
            from prefect.client.orchestration import get_client

            import anyio

            async def artifacts():
                async with get_client() as client:
                    return await client.read_artifacts()

            keys = {a.key for a in anyio.run(artifacts)}
    finally:
        run_mod.planner_plan_fn = original
    assert set(summary["policies"]) == {"ours", "skypilot", "single-type", "static"}
    assert {"replay-summary", "replay-timeline"} <= keys
