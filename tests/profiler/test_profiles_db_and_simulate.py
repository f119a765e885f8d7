"""Profiles land in the user's ProfileDB folder, round-trip, and are what simulate() uses."""

from sailor_core.plan.types import plan_from_dict


def _plan(mbs: int):
    return plan_from_dict({
        "model": "tiny", "global_batch_size": 8 * mbs, "micro_batch_size": mbs,
        "stages": [{"layers": [0, 2], "replicas": [{"gpu": "cpu", "tp": 1}, {"gpu": "cpu", "tp": 1}]},
                   {"layers": [2, 4], "replicas": [{"gpu": "cpu", "tp": 1}, {"gpu": "cpu", "tp": 1}]}],
    })


def test_round_trip_through_the_user_folder(tiny_run):
    from sailor_core.profiler.compute import save_profiles
    from sailor_core.profiles import default_profile_db
    from sailor_core.profiles.store import read_profiles, user_profiles_dir

    path = save_profiles(tiny_run.profiles)
    assert path.parent == user_profiles_dir()
    assert sorted(read_profiles(path), key=lambda p: p.key) == sorted(tiny_run.profiles, key=lambda p: p.key)
    db = default_profile_db()
    for p in tiny_run.profiles:
        assert db.get("tiny", "cpu", 1, p.micro_batch_size, p.seq_len) == p
    # saving again replaces equal keys instead of duplicating them
    save_profiles(tiny_run.profiles[:1])
    assert len(read_profiles(path)) == len(tiny_run.profiles)


def test_simulate_picks_the_profile_up(tiny_run):
    from sailor_core.profiler.compute import save_profiles
    from sailor_core.profiles import ProfileDB
    from sailor_core.simulator import simulate

    prof = next(p for p in tiny_run.profiles if p.micro_batch_size == 4)
    res = simulate(_plan(4), profiles=ProfileDB([prof]))
    for stage in res.stages:
        for rep in stage.replicas:
            assert rep.profile_source == prof.source and rep.measured
    s0 = res.stages[0].replicas[0]
    assert s0.fwd_s == sum(layer.fwd_s for layer in prof.layers[0:2])
    # and through the default database once saved
    save_profiles(tiny_run.profiles)
    res2 = simulate(_plan(4))
    assert res2.stages[1].replicas[0].profile_source == prof.source
    assert res2.iteration_time_s == res.iteration_time_s
