"""A stopping worker's note of its saves (runtime/save_note.py) and the agent's wait on it; the slow
store of the fault hook (every upload waits).  The real stop on a slow store is
``test_stop_during_save.py``."""

from __future__ import annotations

from pathlib import Path

from sailor_core.runtime import faults, save_note
from sailor_core.runtime.save_note import COMMITTED, FILE, STAGED, SaveNote, SaveProgress, StopWait


def test_a_worker_notes_every_piece_with_the_longest_it_took(tmp_path: Path, monkeypatch):
    clock = iter([10.0, 13.0, 14.0, 20.0, 21.0, 22.0, 23.0])
    monkeypatch.setattr(save_note.time, "monotonic", lambda: next(clock))
    path = tmp_path / "rank0.save.json"
    saves = SaveProgress(str(path))
    for what in (STAGED, FILE, COMMITTED):  # a periodic write: 3 s, then 1 s
        saves.on_write(what)
    assert save_note.read_note(path) == SaveNote(progress=3, expected_s=3.0)
    saves.begin()  # a stop: the write after it is timed from its own start, not the last commit
    saves.on_write(STAGED)
    saves.on_write(FILE)
    saves.end()
    assert save_note.read_note(path) == SaveNote(progress=7, expected_s=3.0, done=True)
    SaveProgress(None).on_write(STAGED)  # outside an agent: no note, nothing fails


def test_the_agent_waits_while_a_note_moves_and_no_longer():
    moving = SaveNote(progress=2, expected_s=1000.0)
    # nothing moved since the stop was sent: over after the grace (none here)
    assert StopWait(0.0, 1e6, {0: moving}).over({0: moving, 1: None})
    # a move extends the wait by grace + twice the longest piece
    wait = StopWait(0.0, 1e6, {0: SaveNote(progress=1, expected_s=1000.0)})
    assert not wait.over({0: moving}) and not wait.over({0: moving})
    # a worker done with its saves is not waited for; the hard bound holds whatever moves
    assert StopWait(0.0, 1e6, {}).over({0: SaveNote(progress=5, expected_s=1000.0, done=True)})
    assert StopWait(0.0, 0.0, {}).over({0: moving})
    assert not StopWait(1e6, 1e6, {}).over({})


def test_a_slow_store_delays_every_upload_until_disarmed(tmp_path: Path, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    armed = tmp_path / "slow.json"
    faults.arm_upload(armed, delay_s=2.5, every=True)
    with faults.injected(faults.FaultConfig(upload_file=str(armed))):
        for _ in range(3):
            faults.at(faults.UPLOAD, path="step_00000001/layer_0000.pt")
        armed.unlink()
        faults.at(faults.UPLOAD, path="step_00000001/layer_0001.pt")
    assert slept == [2.5, 2.5, 2.5]
