"""A job's curves: the bounded (time, step) history, samples/s from it, the chart drawn from a state."""

from __future__ import annotations

import dataclasses
import io
import math

import pytest

from sailor_core.job import curves
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec


def test_thin_keeps_the_ends_and_spaces_the_rest_evenly():
    pts = list(range(1001))
    out = curves.thin(pts, 11)
    assert out == tuple(range(0, 1001, 100))
    assert curves.thin(pts[:5], 11) == tuple(pts[:5])
    with pytest.raises(ValueError):
        curves.thin(pts, 1)


def test_the_step_history_stays_bounded_and_spans_the_whole_job():
    pts: tuple = ()
    for step in range(1, 5001):
        pts = curves.with_step_time(pts, float(step), step)
        pts = curves.with_step_time(pts, float(step) + 0.5, step)  # the same step again: no point
    assert len(pts) <= curves.MAX_POINTS
    assert pts[0] == (1.0, 1) and pts[-1] == (5000.0, 5000)
    steps = [s for _, s in pts]
    assert steps == sorted(steps)
    tenths = [sum(1 for s in steps if k * 500 < s <= (k + 1) * 500) for k in range(10)]
    assert min(tenths) >= 10, tenths  # the start of a long job keeps its curve too


def test_samples_per_s_between_points_and_none_across_a_restart():
    pts = [(0.0, 0), (2.0, 4), (4.0, 8), (5.0, 6), (7.0, 10), (11.0, 12), (13.0, 16)]  # 8 -> 6: resumed
    rates = curves.samples_per_s(pts, 8, breaks=[9.0])  # and an attempt started at 9 s, its first step at 11
    assert [(t, r) for t, r in rates if not math.isnan(r)] == [(1.0, 16.0), (3.0, 16.0), (6.0, 16.0), (12.0, 16.0)]
    assert [t for t, r in rates if math.isnan(r)] == [4.5, 9.0]  # the line breaks there


def test_spend_over_time_counts_each_instance_while_it_ran():
    a = _instance("a", launched=100.0)
    b = dataclasses.replace(_instance("b", launched=110.0), ended_unix_s=130.0, end_reason="preempted")
    # 3.6 USD/h = 0.001 USD/s
    assert curves.spent_usd_at([a, b], 90.0) == 0.0
    assert curves.spent_usd_at([a, b], 120.0) == pytest.approx(0.020 + 0.010)
    assert curves.spent_usd_at([a, b], 150.0) == pytest.approx(0.050 + 0.020)


def _instance(iid: str, *, launched: float) -> js.InstanceRecord:
    return js.InstanceRecord(instance_id=iid, cloud="aws", zone="us-east-1a", instance_type="p3.2xlarge",
                             gpu="V100-16", num_gpus=1, usd_per_hr=3.6, spot=True, attempt=1,
                             launched_unix_s=launched)


def test_the_chart_of_a_preempted_job_is_a_png_and_survives_the_state_round_trip():
    from PIL import Image

    s = js.new_job(JobSpec(model="tiny", budget_usd=1.0, steps=20), job_id="c1")
    s = js.with_plan(s, plan={"global_batch_size": 8}, reason="initial plan", usd_per_hr=1.0,
                     throughput_samples_per_s=2.0, now_unix_s=s.created_unix_s)
    s = js.with_instances_launched(s, (_instance("a", launched=s.created_unix_s),))
    for step in range(1, 11):
        s = js.with_progress(s, steps_done=step, losses=[(step, 5.0 - 0.1 * step)],
                             val_losses=[(step, 5.2 - 0.1 * step)] if step % 5 == 0 else [])
    s = js.with_instances_ended(s, {"a"}, "preempted")
    s = js.with_plan(s, plan={"global_batch_size": 8}, reason="preempted", usd_per_hr=1.0,
                     throughput_samples_per_s=2.0)
    assert [t for _, t in s.step_times] == list(range(1, 11))
    back = js.state_from_dict(js.state_to_dict(s))
    assert back.step_times == s.step_times  # a continued job keeps its curve
    png = curves.curves_png(back, back.updated_unix_s)
    with Image.open(io.BytesIO(png)) as im:
        assert im.format == "PNG" and im.size == (9 * 72, 3 * 72)
