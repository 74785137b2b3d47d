"""What a sweep compares when it finds a finished trial (commands/sweep.py): the run config the
trial recorded when it started against the one it would run now."""

from bert_jax.commands import sweep


def test_a_changed_value_is_named_and_a_key_one_side_lacks_is_not():
    """A key the record lacks (a default a later version added) or holds alone (one a later
    version dropped) is not a change of the trial's settings; a value both hold that differs is."""
    before = {"model": {"dropout_rate": 0.3, "old_key": 1}, "seed": 0}
    now = {"model": {"dropout_rate": 0.1, "new_key": "x"}, "seed": 0}
    assert sweep.differing_keys(before, now) == ["model.dropout_rate: 0.3 before, 0.1 now"]
    assert sweep.differing_keys(before | {"model": {"dropout_rate": 0.1}}, now) == []


class _Trial:
    """A trial process whose wait() is interrupted (Ctrl-C) `interrupts` times, then returns 130."""

    def __init__(self, interrupts: int):
        self.interrupts, self.killed = interrupts, False

    def wait(self):
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt
        return 130

    def kill(self):
        self.killed = True


def test_a_ctrl_c_waits_for_the_trial_to_save_and_a_second_stops_it(monkeypatch):
    """Ctrl-C reaches the trial too, which saves its step and exits 130: the sweep waits for
    it (subprocess.call killed it after 0.25 s, before its save); a second Ctrl-C kills it."""
    import pytest

    trial = _Trial(1)
    monkeypatch.setattr(sweep.subprocess, "Popen", lambda *a, **k: trial)
    assert sweep.run_trial(["bert-jax", "train"], None) == 130 and not trial.killed
    trial = _Trial(2)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_trial(["bert-jax", "train"], None)
    assert trial.killed
