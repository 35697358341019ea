"""A program's configuration error told in terms of the operator's fleet file (pure)."""

from __future__ import annotations

from motor_cli.config_errors import error_line, explain

GEN = ".motor/up/coordinator.yaml"
USER = {"schedular": {"policy": "x"}, "scheduler": {"policy": 3}}


def test_an_unknown_key_from_the_operators_section_names_their_file_section_key_and_suggestion() -> None:
    msg = f"{GEN}: unknown configuration key 'schedular' (did you mean 'scheduler'?); known keys here: a, b"
    assert explain(msg, "coordinator", GEN, "typo.yaml", USER) == (
        "typo.yaml: unknown configuration key 'coordinator.schedular' (did you mean 'scheduler'?); known keys here: a, b")


def test_a_bad_value_from_the_operators_section_names_their_file() -> None:
    msg = f"{GEN}: scheduler.policy: 3 is not one of 'round_robin', 'load_balance'"
    assert explain(msg, "coordinator", GEN, "f.yaml", USER) == (
        "f.yaml: coordinator.scheduler.policy: 3 is not one of 'round_robin', 'load_balance'")


def test_a_key_motor_up_generated_keeps_the_generated_file() -> None:
    msg = f"{GEN}: unknown configuration key 'server.bogus'"
    assert explain(msg, "coordinator", GEN, "f.yaml", USER) == msg
    assert explain(msg, "coordinator", GEN, None, {"server": {}}) == msg


def test_an_error_that_is_not_about_a_key_is_kept_as_it_is() -> None:
    msg = "port 9100 is in use (by pid 7, python3); pass --port or free it"
    assert explain(msg, "coordinator", GEN, "f.yaml", USER) == msg


def test_error_line_is_the_programs_last_one_line_error() -> None:
    log = "2026 INFO starting\nerror: first\nTraceback?\nerror: the one\nbye\n"
    assert error_line(log) == "the one"
    assert error_line("nothing here\n") == ""
