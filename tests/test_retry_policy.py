"""The one retry policy: attempts, backoff, which failures are retried, and whether a wait fits."""

import pytest

from agent.providers.base import ProviderError, ProviderErrorKind
from agent.providers.retry import RETRY_POLICY, Retry, RetryPolicy


class Clocks:
    """A turn's clocks that let a wait fit up to `fits_up_to_s`."""

    def __init__(self, fits_up_to_s: float):
        self.fits_up_to_s = fits_up_to_s

    def wait_fits(self, wait_s: float) -> bool:
        return wait_s <= self.fits_up_to_s


def error(kind: str, status: int | None = None, retry_after_s: float | None = None) -> ProviderError:
    return ProviderError(kind, "it failed", status=status, retry_after_s=retry_after_s)


def test_backoff_grows_exponentially_with_jitter_and_a_ceiling():
    assert RETRY_POLICY.backoff_s(1, rng=lambda: 0.0) == pytest.approx(0.25)
    assert RETRY_POLICY.backoff_s(1, rng=lambda: 1.0) == pytest.approx(0.5)
    assert RETRY_POLICY.backoff_s(3, rng=lambda: 1.0) == pytest.approx(2.0)
    assert RETRY_POLICY.backoff_s(20, rng=lambda: 1.0) == pytest.approx(8.0)


def test_retry_after_is_honoured_over_backoff():
    assert RETRY_POLICY.wait_s(1, 3.0) == 3.0
    assert RETRY_POLICY.wait_s(1, -1.0) == 0.0
    assert RETRY_POLICY.wait_s(1, None, rng=lambda: 1.0) == pytest.approx(0.5)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529, 599])
def test_transient_statuses_are_retried(status):
    assert RETRY_POLICY.retryable(error(ProviderErrorKind.SERVER, status))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 600])
def test_statuses_that_cannot_succeed_later_are_not_retried(status):
    assert not RETRY_POLICY.retryable(error(ProviderErrorKind.SERVER, status))


@pytest.mark.parametrize("kind", [ProviderErrorKind.AUTH, ProviderErrorKind.BAD_REQUEST,
                                  ProviderErrorKind.NOT_FOUND, ProviderErrorKind.STOPPED])
def test_a_kind_that_cannot_succeed_is_never_retried_whatever_its_status(kind):
    assert not RETRY_POLICY.retryable(error(kind, 503))
    assert not RETRY_POLICY.retryable(error(kind))


def test_without_a_status_only_connection_and_timeout_are_retried():
    retried = {kind for kind in (ProviderErrorKind.TIMEOUT, ProviderErrorKind.CONNECTION,
                                 ProviderErrorKind.SERVER, ProviderErrorKind.MALFORMED)
               if RETRY_POLICY.retryable(error(kind))}
    assert retried == {ProviderErrorKind.TIMEOUT, ProviderErrorKind.CONNECTION}


def test_a_round_trip_has_five_attempts_and_the_last_has_no_retry():
    assert list(RETRY_POLICY.attempts()) == [1, 2, 3, 4, 5]
    assert RETRY_POLICY.after(error(ProviderErrorKind.CONNECTION), 4, Clocks(60)) is not None
    assert RETRY_POLICY.after(error(ProviderErrorKind.CONNECTION), 5, Clocks(60)) is None


def test_a_retry_says_its_wait_and_whether_the_clocks_fit_it():
    rate_limited = error(ProviderErrorKind.RATE_LIMITED, 429, retry_after_s=30.0)
    assert RETRY_POLICY.after(rate_limited, 1, Clocks(60)) == Retry(wait_s=30.0, fits=True)
    assert RETRY_POLICY.after(rate_limited, 1, Clocks(10)) == Retry(wait_s=30.0, fits=False)


def test_a_failure_that_is_not_retried_gets_no_retry():
    assert RETRY_POLICY.after(error(ProviderErrorKind.AUTH, 401), 1, Clocks(60)) is None


def test_a_policy_is_a_value_with_its_own_attempts():
    once = RetryPolicy(max_attempts=1)
    assert list(once.attempts()) == [1]
    assert once.after(error(ProviderErrorKind.CONNECTION), 1, Clocks(60)) is None


def test_a_refused_stream_is_asked_plainly_only_when_enough_of_the_call_is_left():
    assert RETRY_POLICY.refuses_streaming(400) and RETRY_POLICY.refuses_streaming(501)
    assert not RETRY_POLICY.refuses_streaming(500)
    assert RETRY_POLICY.unstreamed_fits(0.5) and not RETRY_POLICY.unstreamed_fits(0.49)
