"""Cloud API faults at configurable rates on both clouds: retry, fail over, report, never leak.

The embedded cloud's APIs (moto's EC2 server, the GCE fake driven by the real
google-cloud-compute client) answer with throttling, 5xx, capacity, quota and slow
(timed-out) responses at seeded rates.  The provisioner must retry the transient ones,
fail over on capacity/quota, record every try in its history, and -- whether it gets the
GPUs or not -- leave no instance behind that it does not return.  The slow tests run a
whole train job under such faults.
"""

from __future__ import annotations

import pytest

from infra.local.cloud import EmbeddedCloud, providers_for
from infra.local.faults import FaultRates
from infra.retry import RetryPolicy

AWS_REGIONS = ["us-east-1", "us-west-2"]
GCP_ZONES = ["us-central1-a", "us-central1-b", "us-west1-b", "europe-west4-a"]
FAST_RETRY = RetryPolicy(max_attempts=6, base_delay_s=0.01, max_delay_s=0.05)
OUTCOMES = {"ok", "capacity", "quota", "transient", "preempted", "error", "skipped"}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    c = EmbeddedCloud(state_dir=tmp_path_factory.mktemp("cloud"), notice_s=0.3, tick_s=0.1, halt_grace_s=0.2)
    c.start()
    yield c
    c.stop()


def _providers(cloud):
    p = providers_for(cloud.aws_endpoint, cloud.gce_endpoint, retry=FAST_RETRY, aws_regions=AWS_REGIONS,
                      aws_keys=cloud.aws_keys)
    p["gcp"].zones = list(GCP_ZONES)
    return p


def _live(providers, job_id):
    from infra.records import job_labels

    return [i for p in providers.values() for i in p.query_instances(job_labels(job_id)) if i.live]


RATES = [
    FaultRates(throttle=0.2, server_error=0.1, seed=1),
    FaultRates(capacity=0.5, seed=2),
    FaultRates(quota=0.5, seed=3),
    FaultRates(timeout=0.1, timeout_s=0.2, server_error=0.1, seed=4),
    FaultRates(throttle=0.1, server_error=0.1, capacity=0.3, quota=0.15, timeout=0.05, timeout_s=0.2, seed=5),
    FaultRates(throttle=0.1, server_error=0.1, capacity=0.3, quota=0.15, timeout=0.05, timeout_s=0.2, seed=6),
    FaultRates(capacity=1.0, seed=7),
]


@pytest.mark.parametrize("rates", RATES, ids=lambda r: f"seed{r.seed}")
def test_provisioner_retries_fails_over_and_reports_under_api_faults(cloud, rates):
    from infra.provisioner import GpuNeed, ProvisionError, Provisioner

    cloud.reset()
    providers = _providers(cloud)
    provisioner = Provisioner(providers, wait_timeout_s=30)
    offers = provisioner.offers(["T4"])  # before the faults: the flow caches offers too
    assert {o.cloud for o in offers} == {"aws", "gcp"}
    job_id = f"faults-{rates.seed}"
    needs = [GpuNeed(gpu="T4", zone=None, num_gpus=1), GpuNeed(gpu="T4", zone=None, num_gpus=1)]
    cloud.set_faults(rates)
    try:
        try:
            result = provisioner.provision(needs, job_id=job_id, attempt=1, offers=offers)
            history, error = result.history, None
        except ProvisionError as exc:
            result, history, error = None, exc.history, exc
        injected = dict(cloud.faults.injected)
    finally:
        cloud.set_faults(FaultRates())

    outcomes = [h.outcome for h in history]
    assert set(outcomes) <= OUTCOMES, outcomes
    # Every refusal the clouds gave a launch shows in the history as the failover's reason to move on.
    assert outcomes.count("capacity") <= injected["capacity"]
    assert outcomes.count("quota") <= injected["quota"]
    for i, h in enumerate(history):
        if h.outcome == "quota":  # quotas are regional: the rest of that region is skipped, not tried
            region = h.zone.rsplit("-", 1)[0] if h.cloud == "gcp" else h.zone[:-1]
            later = [x for x in history[i + 1:] if x.cloud == h.cloud and x.zone.startswith(region)]
            assert all(x.outcome == "skipped" for x in later), history
    if result is not None:
        assert result.complete and len(result.instances) == 2
        assert outcomes.count("ok") == 2 and outcomes[-1] == "ok"
        live = {i.instance_id for i in _live(providers, job_id)}
        assert live == {i.instance_id for i in result.instances}, "an instance outside the result was left running"
        assert len(result.history_lines()) == len(history)
    else:
        assert error is not None and "\n" not in str(error) and "tried:" in str(error)
        assert rates.capacity + rates.quota > 0, f"only transient faults, yet no GPUs: {error}"
        assert _live(providers, job_id) == [], "a failed provisioning left instances running"
    if rates.capacity == 1.0:
        assert result is None and outcomes.count("capacity") >= 2
    if rates.throttle + rates.server_error + rates.timeout > 0:
        assert injected["throttle"] + injected["server_error"] + injected["timeout"] > 0
        assert sum(p.num_retries for p in providers.values()) > 0, "transient faults were not retried"
    provisioner.teardown(job_id)
    assert _live(providers, job_id) == []


def test_persistent_server_errors_surface_as_one_clear_error(cloud):
    from infra.errors import TransientCloudError
    from infra.provisioner import GpuNeed, ProvisionError, Provisioner

    cloud.reset()
    providers = _providers(cloud)
    provisioner = Provisioner(providers, wait_timeout_s=10)
    offers = provisioner.offers(["T4"])
    cloud.set_faults(FaultRates(server_error=1.0, seed=9))
    try:
        with pytest.raises((ProvisionError, TransientCloudError)) as info:
            provisioner.provision([GpuNeed(gpu="T4", zone=None, num_gpus=1)], job_id="faults-5xx", attempt=1,
                                  offers=offers)
    finally:
        cloud.set_faults(FaultRates())
    assert "\n" not in str(info.value)
    assert _live(providers, "faults-5xx") == []


# ---- a whole job under API faults (slow) --------------------------------------------------


@pytest.fixture(scope="module")
def chaos_env(tmp_path_factory):
    from tests.reliability.chaos import ChaosEnv

    with ChaosEnv(tmp_path_factory.mktemp("faults-home")) as env:
        yield env


@pytest.mark.slow
def test_a_job_completes_under_moderate_api_faults(chaos_env):
    from tests.reliability.chaos import run_trial

    chaos_env.control("faults", {"throttle": 0.1, "server_error": 0.05, "capacity": 0.2, "quota": 0.05,
                                 "timeout": 0.02, "timeout_s": 1.0, "seed": 11})
    try:
        result = run_trial(chaos_env, seed=11, steps=8, ckpt_every=4, num_faults=0)
    finally:
        status = _status(chaos_env)
        chaos_env.control("faults", {})
    assert sum(status["faults_injected"].values()) > 0, "no fault was injected"
    assert result.passed, result.failures
    assert result.instances_left_running == 0


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the flow tries every zone of both clouds in 7 rounds before it gives up
def test_a_job_with_no_launchable_capacity_stops_with_a_clear_reason(chaos_env):
    from tests.reliability.chaos import run_trial
    from sailor_core.job import state as js

    chaos_env.control("faults", {"quota": 1.0, "seed": 12})
    try:
        # Two zones (one per cloud) keep each of the flow's 7 failover rounds short.
        result = run_trial(chaos_env, seed=12, steps=4, ckpt_every=2, num_faults=0, timeout_s=1200,
                           flow_overrides={"zones": ["us-central1-a", "us-east-1a"]})
    finally:
        chaos_env.control("faults", {})
    state = js.JobStore(chaos_env.jobs_url()).load(result.job_id)
    assert state.status == "failed", state.status
    reason = state.status_reason
    assert reason and "\n" not in reason and ("capacity" in reason or "quota" in reason.lower()), reason
    assert result.instances_left_running == 0
    assert state.usd_spent(state.updated_unix_s) == 0.0


def _status(env) -> dict:
    import json
    import urllib.request

    from infra.config import control_headers

    request = urllib.request.Request(f"{env.cloud['control_url']}/status", headers=control_headers(env.cloud))
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())
