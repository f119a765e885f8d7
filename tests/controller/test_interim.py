"""The interim plan's rule (controller/interim.py): which GPUs, which plan, when it pays."""

import pytest

from sailor_core.controller.interim import interim_option, interim_pays, kept_gpus

from tests.controller.planners import linear_option, linear_planner

A = ("A100-40", "us-central1-a")
V = ("V100-16", "us-east-1a")


def test_the_interim_uses_only_what_the_next_plan_keeps_of_what_is_held():
    assert kept_gpus({A: 4, V: 2}, {A: 3, V: 5}) == {A: 3, V: 2}
    assert kept_gpus({A: 4}, {V: 2}) == {}


def test_the_fastest_plan_that_fits_the_kept_gpus():
    assert interim_option(linear_planner, {A: 3, V: 2}).gpus == {A: 3, V: 2}
    assert interim_option(linear_planner, {}) is None

    def too_big(available):  # a planner that answers with more than it was given
        return [linear_option({k: n + 1 for k, n in available.items()}), linear_option({A: 1})]

    assert interim_option(too_big, {A: 2}).gpus == {A: 1}


@pytest.mark.parametrize(("window_s", "pays"), [
    (100.0, True),   # 70 s of training at 30/s (2100) against the save's 10 s delay at 40/s (400)
    (45.0, True),    # 15 s: 450 > 400
    (42.0, False),   # 12 s: 360 < 400
    (30.0, False),   # rejoin, load and save fill the window
])
def test_an_interim_pays_when_its_training_outweighs_the_save_it_adds(window_s, pays):
    assert interim_pays(window_s=window_s, rejoin_s=10.0, load_s=10.0, save_s=10.0,
                        interim_samples_per_s=30.0, next_samples_per_s=40.0) is pays
