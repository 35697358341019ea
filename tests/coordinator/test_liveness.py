"""Stalled-attempt verdicts (pure): innocent only when a probe found the engine silent first."""

from __future__ import annotations

from motor_coordinator.liveness import Liveness

E = ("127.0.0.1", 8000)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_silence_is_measured_from_the_later_of_send_and_last_sign_of_life() -> None:
    clock = Clock()
    live = Liveness(clock)
    live.alive(E)
    a = live.sent(E)
    clock.t += 3
    assert live.silent_for(a) == 3
    live.alive(E)  # e.g. a passing probe: the engine is alive, the attempt is merely slow
    clock.t += 1
    assert live.silent_for(a) == 1


def test_an_attempt_sent_after_a_probe_found_the_engine_silent_is_innocent() -> None:
    clock = Clock()
    live = Liveness(clock)
    live.alive(E)
    clock.t += 0.5
    probe_sent = clock.t
    clock.t += 0.5
    live.probe_failed(E, probe_sent)
    clock.t += 0.1
    late = live.sent(E)
    assert live.innocent(late)


def test_the_attempt_the_engine_was_serving_and_an_instant_poison_are_suspects() -> None:
    clock = Clock()
    live = Liveness(clock)
    live.alive(E)
    serving = live.sent(E)  # on the engine while it still answered
    clock.t += 0.2
    live.alive(E)
    clock.t += 0.1
    instant = live.sent(E)  # the engine hangs the moment this one arrives
    clock.t += 0.3
    probe_sent = clock.t
    live.probe_failed(E, probe_sent)
    clock.t += 5
    assert not live.innocent(serving)
    # an older stalled attempt does not vouch for a newer one: the newer may be the poison
    assert not live.innocent(instant)
    clock.t += 0.1
    assert live.innocent(live.sent(E))


def test_a_sign_of_life_withdraws_the_probes_testimony() -> None:
    clock = Clock()
    live = Liveness(clock)
    live.probe_failed(E, clock.t + 1)  # a probe of a silent engine
    clock.t += 2
    live.alive(E)  # then it answered again
    clock.t += 1
    assert not live.innocent(live.sent(E))
    live.probe_failed(E, clock.t - 5)  # a stale failure from before the last sign of life
    assert not live.innocent(live.sent(E))


def test_forgotten_engines_start_afresh() -> None:
    clock = Clock()
    live = Liveness(clock)
    live.probe_failed(E, clock.t + 1)
    clock.t += 2
    live.forget(set())
    assert not live.innocent(live.sent(E))


def test_alive_since_tells_a_probe_that_waited_while_the_engine_answered_requests() -> None:
    clock = Clock()
    live = Liveness(clock)
    assert not live.alive_since(E, 0.0)  # never heard of
    live.alive(E)
    probe_sent = clock.t
    clock.t += 2
    assert not live.alive_since(E, probe_sent)  # silent while the probe waited: the failure counts
    live.alive(E)  # a streamed chunk arrives while the probe still waits
    assert live.alive_since(E, probe_sent)


def test_an_explained_silence_makes_every_attempt_innocent_until_the_engine_lives() -> None:
    clock = Clock()
    live = Liveness(clock)
    live.alive(E)
    episode = live.episode(E)
    serving = live.sent(E)
    clock.t += 5
    assert not live.innocent(serving)
    live.explain(E)  # a convicted poison request was on it
    assert live.innocent(serving)
    assert live.episode(E) == episode
    clock.t += 1
    live.alive(E)
    assert live.episode(E) == clock.t
    assert not live.innocent(live.sent(E))
