"""The three clocks, on a fake clock."""

import pytest

from agent.deadline import TOOL_CUT_SLACK_S, Budget
from agent.settings import TurnConfig


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def budget(clock, **overrides) -> Budget:
    config = TurnConfig(job_timeout_s=120, deadline_margin_s=20, call_timeout_cap_s=60, connect_timeout_s=10,
                        min_call_s=5)
    return Budget.for_turn(config.with_changes(**overrides), started_at=clock.now, clock=clock)


def test_deadline_is_job_start_plus_job_timeout_minus_margin():
    clock = FakeClock()
    b = budget(clock)
    assert b.job_timeout_at == 1120
    assert b.deadline_at == 1100


def test_early_call_gets_the_cap():
    clock = FakeClock()
    timeout = budget(clock).call_timeout()
    assert timeout.total_s == 60
    assert timeout.connect_s == 10


def test_late_call_timeout_equals_what_remains_not_the_cap():
    clock = FakeClock()
    b = budget(clock)
    clock.now += 88.5
    timeout = b.call_timeout()
    assert timeout.total_s == pytest.approx(11.5)
    assert timeout.connect_s == 10


def test_connect_timeout_is_also_bounded_by_what_remains():
    clock = FakeClock()
    b = budget(clock)
    clock.now += 93
    assert b.call_timeout().connect_s == pytest.approx(7)


def test_call_is_skipped_when_less_than_minimum_remains():
    clock = FakeClock()
    b = budget(clock)
    clock.now += 95.01
    assert b.call_timeout() is None
    assert not b.can_call()


def test_remaining_never_goes_negative():
    clock = FakeClock()
    b = budget(clock)
    clock.now += 500
    assert b.remaining_s() == 0


def test_only_one_call_left_when_a_second_could_not_start():
    clock = FakeClock()
    b = budget(clock)
    clock.now += 89  # 11 s left: two 5 s calls would still fit
    assert not b.only_one_call_left()
    clock.now += 3  # 8 s left: one call, not two
    assert b.only_one_call_left()


def test_a_wait_fits_only_if_a_call_can_start_after_it():
    clock = FakeClock()
    b = budget(clock)
    clock.now += 90  # 10 s left
    assert b.wait_fits(4.9)
    assert not b.wait_fits(5.1)


@pytest.mark.parametrize(("elapsed_s", "tool_cap_s", "expected_s"), [
    (0, 30, 30),  # early: the tool cap
    (0, float("inf"), 100 - 5 - TOOL_CUT_SLACK_S),  # no cap: all but what the last call needs
    (80, 30, 20 - 5 - TOOL_CUT_SLACK_S),  # late: the time left less the last call's minimum
    (94.9, 30, 0.0),  # less than the last call needs: never below zero
    (500, 30, 0.0),  # past the deadline
])
def test_a_tools_limit_keeps_the_last_calls_minimum_free(elapsed_s, tool_cap_s, expected_s):
    clock = FakeClock()
    b = budget(clock, tool_timeout_cap_s=tool_cap_s)
    clock.now += elapsed_s
    assert b.tool_timeout_s() == pytest.approx(expected_s)
    if expected_s > 0:
        clock.now += expected_s  # a tool that runs to its limit
        assert b.can_call(), "the last call can still start after it"
