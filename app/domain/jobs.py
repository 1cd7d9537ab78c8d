"""The job state machine and the retry policy, free of I/O."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.errors import InvalidInput, InvalidTransition


class JobStatus(enum.StrEnum):
    QUEUED = "QUEUED"
    INFLIGHT = "INFLIGHT"
    DELIVERED = "DELIVERED"
    DEAD = "DEAD"


class AckType(enum.StrEnum):
    ACK = "ack"
    NAK = "nak"
    TERM = "term"
    PROGRESS = "progress"


# Moves a pull consumer may request through the seed API (`NextState`).
SEED_TRANSITIONS: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (JobStatus.QUEUED, JobStatus.INFLIGHT),
        (JobStatus.INFLIGHT, JobStatus.DELIVERED),
        (JobStatus.INFLIGHT, JobStatus.DEAD),
        (JobStatus.DEAD, JobStatus.INFLIGHT),
    }
)


def parse_next_state(value: object) -> JobStatus:
    """Any job status; QUEUED is only ever good for "already there" (the Go original's Q -> Q)."""
    if not isinstance(value, str):
        raise InvalidInput("NextState must be one of INFLIGHT, DELIVERED, DEAD")
    try:
        return JobStatus(value)
    except ValueError:
        raise InvalidInput(f"unknown NextState {value!r}") from None


def check_seed_transition(
    current: JobStatus, target: JobStatus, incremental_timeout: int | None
) -> bool:
    """Validate a seed-API move; False means "already there, change nothing".

    An IncrementalTimeout of 0 means none, as in the Go original (an unsigned zero value).
    """
    if incremental_timeout and not (
        target is JobStatus.INFLIGHT and current in (JobStatus.QUEUED, JobStatus.DEAD)
    ):
        raise InvalidInput(
            "IncrementalTimeout is only allowed when moving a QUEUED or DEAD job to INFLIGHT"
        )
    if current is target:
        return False
    if (current, target) not in SEED_TRANSITIONS:
        raise InvalidTransition(f"a job cannot move from {current} to {target}")
    return True


def nak_delay(delay: float | None) -> float:
    """When a nak'd job is due again, for every transport alike: after its delay, or at once
    without one, as JetStream's -NAK; either way the nak counts a retry. (The backoff is for
    deliveries that failed, not for a consumer that hands a job back.)"""
    return 0.0 if delay is None else delay


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failures are retried: `max_retry` retries, delays from `backoff_delays` (seconds)."""

    max_retry: int
    backoff_delays: tuple[int, ...]

    def backoff(self, retry: int) -> int:
        """Delay before the `retry`-th retry (1-based)."""
        return backoff_seconds(self.backoff_delays, retry)

    def exhausted(self, retries_so_far: int) -> bool:
        return retries_so_far >= self.max_retry


def backoff_seconds(delays: Sequence[int], retry: int) -> int:
    """D[k-1] while k < len(D), then grow linearly by the last delay (5,30,60 -> 5,30,60,120...)."""
    if retry < 1:
        return 0
    last = len(delays)
    if retry < last:
        return delays[retry - 1]
    return (retry - last + 1) * delays[last - 1]
