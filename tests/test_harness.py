"""The shared harness's pure parts: percentiles and waiting for an event."""

from __future__ import annotations

import itertools
import os

import pytest

from harness.processes import alive, children, processes_with_env, rss_kib
from harness.stats import percentile, summary
from harness.waiting import wait_for


def test_percentiles_interpolate_between_the_nearest_values():
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)
    with pytest.raises(ValueError):
        percentile([1.0, 2.0], 100)


def test_a_summary_scales_and_rounds():
    assert summary([0.001, 0.002, 0.003], scale=1000) == {"n": 3, "p50": 2.0, "p95": 2.9, "min": 1.0, "max": 3.0}
    assert summary([]) == {"n": 0, "p50": None, "p95": None, "min": None, "max": None}


def test_wait_for_returns_the_first_truthy_value_or_names_what_never_happened():
    counter = itertools.count()
    assert wait_for(lambda: next(counter) >= 3 and "ready", 5, poll_s=0.001) == "ready"
    with pytest.raises(AssertionError, match="the impossible"):
        wait_for(lambda: False, 0.05, "the impossible", poll_s=0.01)


def test_this_process_is_alive_measured_and_found_by_its_environment():
    assert alive(os.getpid()) and rss_kib(os.getpid()) > 0
    assert not alive(2**22 + 1) and rss_kib(2**22 + 1) == 0 and children(2**22 + 1) == []
    assert os.getpid() not in processes_with_env("PATH", os.environ["PATH"])  # never the caller itself
