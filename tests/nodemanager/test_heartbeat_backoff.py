"""Heartbeat reconnect back-off (pure)."""

from __future__ import annotations

from motor_nodemanager.heartbeat import reconnect_delay


def test_one_controller_backs_off_exponentially_up_to_the_cap() -> None:
    assert [reconnect_delay(n) for n in range(1, 8)] == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_with_two_controllers_every_address_is_tried_before_the_delay_grows() -> None:
    # Failure 1 moves to the standby, failure 2 back to the old master: one round per doubling,
    # so a standby that took over is reached quickly instead of after the old master's back-off.
    assert [reconnect_delay(n, addresses=2) for n in range(1, 7)] == [0.25, 0.25, 0.5, 0.5, 1.0, 1.0]
