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


class _Store:
    """JAX's key-value store (jax.distributed's client), as Preemption uses it."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str) -> None:
        self.values[key] = value

    def key_value_try_get(self, key: str) -> str:
        if key not in self.values:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.values[key]


class _Agreement:
    """The processes' preemption sync point: reached at step 5 once JAX's notifier saw SIGTERM."""

    def __init__(self) -> None:
        self.notified = False

    def reached_preemption(self, step: int) -> bool:
        return self.notified and step >= 5


def test_ctrl_c_in_one_of_several_processes_goes_to_their_agreement_on_a_step():
    """Not a save of this process alone (a save is collective): Ctrl-C says so in the store,
    then raises SIGTERM for JAX's notifier (stood for by a handler here), whose sync point
    stops every process at one step; each then reads that it was a Ctrl-C."""
    agreement, store = _Agreement(), _Store()
    jax_notifier = signal.signal(signal.SIGTERM, lambda *_: setattr(agreement, "notified", True))
    try:
        with train.Preemption(agreement, store) as here, train.Preemption(agreement, store) as peer:
            # (two processes' Preemption in one: the peer's SIGINT handler is the one installed)
            assert not here.due(3) and not here.stopped_by_ctrl_c()
            signal.raise_signal(signal.SIGINT)
            assert agreement.notified and peer.interrupted and not here.interrupted
            assert not here.due(4) and not peer.due(4)  # nobody stops before the agreed step
            assert here.due(5) and peer.due(5)
            assert here.stopped_by_ctrl_c() and peer.stopped_by_ctrl_c()  # both exit 130
            with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C: at once
                signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # JAX's notifier left in place
    finally:
        signal.signal(signal.SIGTERM, jax_notifier)


def test_sigterm_in_one_of_several_processes_is_left_to_jaxs_notifier():
    agreement, store = _Agreement(), _Store()
    jax_notifier = signal.signal(signal.SIGTERM, lambda *_: setattr(agreement, "notified", True))
    try:
        with train.Preemption(agreement, store) as preemption:
            signal.raise_signal(signal.SIGTERM)
            assert not preemption.due(4) and preemption.due(5)
            assert not preemption.stopped_by_ctrl_c()  # a preemption: exit 0
    finally:
        signal.signal(signal.SIGTERM, jax_notifier)


def test_without_jaxs_preemption_service_a_multi_process_run_keeps_the_default_signals(
        monkeypatch, caplog):
    """No store (JAX_ENABLE_PREEMPTION_SERVICE=false) in a run of several processes: no step can
    be agreed, and a save of one process alone would wait for the others forever, so Ctrl-C and
    SIGTERM keep their defaults (the process stops at once) and the run says so at its start."""
    monkeypatch.setattr(train.jax, "process_count", lambda: 2)
    # Python's own Ctrl-C handler, as in a `bert-jax` process (a pytest-xdist worker has another)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sigterm = signal.getsignal(signal.SIGTERM)
        with caplog.at_level("WARNING"), train.Preemption(_NoPeers()) as preemption:
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            assert signal.getsignal(signal.SIGTERM) is sigterm
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            assert not preemption.due(3) and not preemption.interrupted
    finally:
        signal.signal(signal.SIGINT, before)
    assert "preemption service is off" in caplog.text
