"""The one retry policy of a model call: its attempts, the wait before each retry, which failures are
retried, whether a wait fits the time left, and when a refused stream is asked again plainly.

    wait before retry n = the server's Retry-After when it gave one, else
                          backoff = min(max, base * 2^(n-1)), with full jitter: in [backoff/2, backoff]
    a retry happens     = the failure is retryable, an attempt is left, and the wait fits (a call can
                          still start after it, as the turn's clocks say)

Each provider names its own errors and maps them to a status (agent.providers.server_errors) and so
to a ProviderErrorKind; this policy alone says which of those are asked again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.providers.base import ProviderError, ProviderErrorKind

MAX_ATTEMPTS_PER_CALL = 5  # one model round-trip: the first try and up to four retries
BACKOFF_BASE_S = 0.5  # seconds before the first retry
BACKOFF_MAX_S = 8.0  # seconds, the longest backoff without Retry-After
# Statuses that say "not now" rather than "never": timeout, conflict, rate limit, any 5xx, overloaded.
RETRIED_STATUSES = frozenset({408, 409, 429, *range(500, 600)})
# The same request would fail the same way: these are never retried, whatever their status.
NEVER_RETRIED = frozenset({ProviderErrorKind.AUTH, ProviderErrorKind.BAD_REQUEST, ProviderErrorKind.NOT_FOUND,
                           ProviderErrorKind.STOPPED})
# Failures with no status that are retried: the network, or a server too slow this once.
RETRIED_WITHOUT_STATUS = frozenset({ProviderErrorKind.CONNECTION, ProviderErrorKind.TIMEOUT})
STREAM_REFUSAL_STATUSES = frozenset({400, 415, 422, 501})  # how servers say "not with these parameters"
MIN_UNSTREAMED_S = 0.5  # seconds; with less left of a call after a refusal to stream, the refusal is the answer

Rng = Callable[[], float]


class Waits(Protocol):
    """The turn's clocks, as far as a retry asks them."""

    def wait_fits(self, wait_s: float) -> bool:
        """A wait fits when a call can still start after it."""


@dataclass(frozen=True)
class Retry:
    """The retry after a failed attempt: how long to wait first, and whether that fits the time left."""

    wait_s: float
    fits: bool


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed model call is asked again, and after how long."""

    max_attempts: int = MAX_ATTEMPTS_PER_CALL
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_max_s: float = BACKOFF_MAX_S
    retried_statuses: frozenset[int] = RETRIED_STATUSES
    never_retried: frozenset[str] = NEVER_RETRIED
    retried_without_status: frozenset[str] = RETRIED_WITHOUT_STATUS
    stream_refusal_statuses: frozenset[int] = STREAM_REFUSAL_STATUSES
    min_unstreamed_s: float = MIN_UNSTREAMED_S

    def attempts(self) -> range:
        """The attempt numbers of one model round-trip, from 1."""
        return range(1, self.max_attempts + 1)

    def attempt_left(self, attempt: int) -> bool:
        return attempt < self.max_attempts

    def retries_status(self, status: int) -> bool:
        """An HTTP status that says the same request may succeed later."""
        return status in self.retried_statuses

    def retryable(self, error: ProviderError) -> bool:
        """Asking the same again could succeed: by its status when it has one, else by its kind."""
        if error.kind in self.never_retried:  # whatever the status: asking the same again cannot succeed
            return False
        if error.status is not None:
            return self.retries_status(error.status)
        return error.kind in self.retried_without_status

    def backoff_s(self, attempt: int, rng: Rng = random.random) -> float:
        """Exponential backoff with full jitter for retry number `attempt` (1-based)."""
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        return ceiling / 2 + rng() * ceiling / 2

    def wait_s(self, attempt: int, retry_after_s: float | None, rng: Rng = random.random) -> float:
        """How long to wait before retry `attempt`: the server's Retry-After when given, else backoff."""
        if retry_after_s is not None:
            return max(0.0, retry_after_s)
        return self.backoff_s(attempt, rng)

    def after(self, error: ProviderError, attempt: int, clocks: Waits, rng: Rng = random.random) -> Retry | None:
        """The retry after failed attempt `attempt`; None when the failure is not retried or no attempt is left."""
        if not self.retryable(error) or not self.attempt_left(attempt):
            return None
        wait_s = self.wait_s(attempt, error.retry_after_s, rng)
        return Retry(wait_s=wait_s, fits=clocks.wait_fits(wait_s))

    def refuses_streaming(self, status: int) -> bool:
        """A status with which servers refuse a parameter: asked plainly when its text names streaming."""
        return status in self.stream_refusal_statuses

    def unstreamed_fits(self, left_s: float) -> bool:
        """Enough of the call's time is left to ask again without streaming."""
        return left_s >= self.min_unstreamed_s


RETRY_POLICY = RetryPolicy()
