"""A job's numbers and plans in words (sailor_core.job.report): what the terminal, `sailor jobs`
and the Prefect artifacts show people."""

from __future__ import annotations

from sailor_core.job import report
from sailor_core.job import state as js
from sailor_core.job.spec import JobSpec


def test_numbers_keep_significant_digits_and_say_their_units():
    # The Pareto table printed 0.000000 for USD per iteration.
    assert report.sig(0.0000021412) == "0.00000214"
    assert report.sig(4.93941) == "4.94" and report.sig(1234.5) == "1,234" and report.sig(0) == "0"
    assert report.sig(None) == "-" and report.sig(float("nan")) == "-"
    assert report.usd(0.0123456) == "0.0123 USD" and report.usd(12.345) == "12.35 USD"
    assert report.spend(0.0123, 0.05) == "0.0123 of 0.0500 USD (25 %)"
    assert [report.duration(s) for s in (4.4, 192, 3900)] == ["4 s", "3 min 12 s", "1 h 05 min"]


def test_a_plan_reads_as_one_line():
    plan = {"model": "tiny", "micro_batch_size": 2, "stages": [
        {"layers": [0, 2], "replicas": [{"gpu": "T4", "tp": 2, "zone": "us-central1-a"}]},
        {"layers": [2, 6], "replicas": [{"gpu": "T4", "tp": 1, "zone": "us-central1-a"},
                                        {"gpu": "L4", "tp": 1, "zone": "us-east1-c"}]}]}
    assert report.plan_gpus(plan) == {("T4", "us-central1-a"): 3, ("L4", "us-east1-c"): 1}
    assert report.plan_line(plan, usd_per_hr=0.3) == (
        "1 L4 in us-east1-c + 3 T4 in us-central1-a, 2 stages, micro-batch 2, 0.300 USD/h")
    nodes = [{"instance_type": "n1-standard-8-t4x2", "gpus_per_node": 2, "gpu": "T4", "zone": "us-central1-a"}] * 2
    assert report.nodes_line(nodes) == "2 x n1-standard-8-t4x2 (2 T4) in us-central1-a"


def test_the_status_says_step_loss_throughput_spend_plan_and_last_event():
    progress = report.Progress(steps_done=12, steps_target=30, loss=5.43219, val_loss=(10, 5.5), samples_per_s=13.61)
    text = report.status_markdown(progress=progress, budget=report.BudgetUse(spent_usd=0.0123, budget_usd=0.05),
                                  usd_per_hr_now=0.3, attempt=2, status="running",
                                  plan="2 T4 in us-central1-b", last_event=(0.0, "re-planned on 2 T4 in us-central1-b"))
    lines = text.split("\n\n")
    assert lines[0] == "**Step 12 of 30** (40 %) · loss 5.432 · val loss 5.500 (step 10) · 13.6 samples/s"
    assert lines[1] == "**Spent** 0.0123 of 0.0500 USD (25 %) · 0.300 USD/h now · running"
    assert lines[2] == "**Plan** (attempt 2): 2 T4 in us-central1-b"
    assert lines[3].startswith("**Last event** ") and lines[3].endswith(": re-planned on 2 T4 in us-central1-b")


def test_the_spend_says_egress_and_the_checkpoints_share_of_it_apart():
    assert report.rent_and_egress(0.0123, 0.0) == "GPU rent 0.0123 USD + egress 0 USD"
    assert report.rent_and_egress(0.0123, 0.005, 0.002) == (
        "GPU rent 0.0123 USD + egress 0.00500 USD (checkpoints 0.00200 USD)")
    progress = report.Progress(steps_done=12, steps_target=30, loss=5.4)
    budget = report.BudgetUse(spent_usd=0.0173, budget_usd=0.05, egress_usd=0.005, checkpoint_egress_usd=0.002)
    text = report.status_markdown(progress=progress, budget=budget, usd_per_hr_now=0.3, attempt=1,
                                  status="running", plan="1 T4 in us-east-1a", last_event=None)
    assert text.split("\n\n")[1] == ("**Spent** 0.0173 of 0.0500 USD (35 %) (egress 0.00500 USD, checkpoints "
                                      "0.00200 USD) · 0.300 USD/h now · running")


def test_the_cost_table_is_short_enough_for_a_laptop():
    s = js.new_job(JobSpec(budget_usd=0.05), job_id="tiny-20261201-224834-c3d1")
    s = js.with_instances_launched(s, (js.InstanceRecord(
        instance_id="sailor-tiny-20261201-224834-c3d1-a1-fb0040", cloud="gcp", zone="us-central1-a",
        instance_type="n1-standard-8-t4x2", gpu="T4", num_gpus=2, usd_per_hr=0.3, spot=True, attempt=1,
        launched_unix_s=100.0),))
    s = js.with_instances_ended(s, {"sailor-tiny-20261201-224834-c3d1-a1-fb0040"}, "preempted", now_unix_s=111.0)
    [row] = report.cost_rows(s.instances, s.ledger().by_instance(200.0), 200.0)
    assert row == {"instance": "a1-fb0040", "type": "n1-standard-8-t4x2", "zone": "us-central1-a", "attempt": 1,
                   "USD/h": "0.300", "ran": "11 s", "USD": "0.000917", "ended": "preempted"}
    assert sum(len(str(v)) for v in row.values()) < 80


def test_how_workers_came_back_names_where_rank_0_took_its_state():
    words = {source: report.restart_words(num_ranks=2, num_ranks_rejoined=1, ready_s=0.4, state_from=source)
             for source in ("memory", "peers", "checkpoint")}
    assert words == {"memory": "workers ready in 0.4 s (1 of 2 ranks kept their processes; rank 0 state kept in memory)",
                     "peers": "workers ready in 0.4 s (1 of 2 ranks kept their processes; "
                              "rank 0 state handed over by its peers)",
                     "checkpoint": "workers ready in 0.4 s (1 of 2 ranks kept their processes; "
                                   "rank 0 state read from the checkpoint)"}


def test_ranks_in_standby_workers_are_not_said_to_have_kept_their_processes():
    """A new instance's standby worker (started at boot, no state) is no survivor."""
    both = report.restart_words(num_ranks=2, num_ranks_rejoined=1, num_ranks_standby=1, ready_s=0.4,
                                state_from="memory")
    assert both == ("workers ready in 0.4 s (1 of 2 ranks kept their processes, 1 of 2 ranks in standby workers; "
                    "rank 0 state kept in memory)")
    fresh = report.restart_words(num_ranks=2, num_ranks_rejoined=0, num_ranks_standby=2, ready_s=1.5, state_from=None)
    assert fresh == "workers ready in 1.5 s (2 of 2 ranks in standby workers)"
    assert report.restart_words(num_ranks=2, num_ranks_rejoined=0, ready_s=1.5, state_from=None) == \
        "workers ready in 1.5 s (new worker processes)"
