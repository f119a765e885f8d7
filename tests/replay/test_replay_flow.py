"""The replay flow against a real local Prefect server: it runs and publishes its artifacts."""


import pytest

from sailor_core.ports import free_port

pytestmark = pytest.mark.slow


def test_replay_flow_publishes_summary_and_timeline(tmp_path, monkeypatch):
    import anyio

    import sailor_core.replay.run as run_mod
    from flows.cli.prefect_server import start_local_server, stop_local_server
    from tests.controller.planners import linear_planner

    monkeypatch.setenv("SAILOR_HOME", str(tmp_path / "home"))
    api_url = start_local_server(port=free_port())
    try:
        from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings

        monkeypatch.setenv("PREFECT_API_URL", api_url)
        # The real planner is exercised by the benchmarks and the CLI; here the flow's plumbing.
        monkeypatch.setattr(run_mod, "planner_plan_fn", lambda *_a, **_kw: linear_planner)
        trace = tmp_path / "t.csv"
        trace.write_text(",Timestamp,A100-40_us-central1-a,V100-16_us-central1-a\n0,0,4,4\n1,3600,2,4\n2,7200,4,4\n")
        # The flow's logs would reach the API in batches after the server below is stopped.
        with temporary_settings({PREFECT_API_URL: api_url, PREFECT_LOGGING_TO_API_ENABLED: False}):
            from prefect.client.orchestration import get_client

            from flows.replay_flow import replay_flow

            summary = replay_flow(trace=str(trace), model="opt-350m", tokens=2e9)

            async def artifacts():
                async with get_client() as client:
                    return await client.read_artifacts()

            found = {a.key: a for a in anyio.run(artifacts)}
    finally:
        stop_local_server()
    assert set(summary["policies"]) == {"ours", "skypilot", "single-type", "static"}
    assert "replay-summary" in found and "replay-timeline" in found
    assert "paid_gpu_time" in found["replay-summary"].data and "training" in found["replay-summary"].data
    assert "data:image/png;base64," in found["replay-timeline"].data
