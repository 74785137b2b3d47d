"""Ctrl-C during training (train.Preemption): the first saves the step reached and ends the run
as interrupted, as SIGTERM does; a second stops at once."""

import signal

import pytest

from bert_jax.training import train


class _NoPeers:
    def reached_preemption(self, step: int) -> bool:
        return False


def test_the_first_ctrl_c_asks_for_a_save_and_the_second_stops_at_once():
    before = signal.getsignal(signal.SIGINT)
    with train.Preemption(_NoPeers()) as preemption:
        assert not preemption.due(3)
        signal.raise_signal(signal.SIGINT)
        assert preemption.due(3) and preemption.interrupted
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_asks_for_a_save_and_is_no_interruption():
    with train.Preemption(_NoPeers()) as preemption:
        signal.raise_signal(signal.SIGTERM)
        assert preemption.due(1) and not preemption.interrupted
