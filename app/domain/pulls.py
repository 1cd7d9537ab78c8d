"""What pull consumers ask for and get back, whichever transport carries it (HTTP, NATS)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from app.domain.errors import NotFound
from app.domain.jobs import AckType
from app.domain.models import PulledJob

# Job ids are BIGINT: anything larger names no job.
MAX_JOB_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ConsumerCredentials:
    channel_id: str
    channel_token: str | None
    consumer_id: str
    consumer_token: str | None

    @property
    def complete(self) -> bool:
        """Both tokens given: only then can one statement check them and do the work."""
        return self.channel_token is not None and self.consumer_token is not None


@dataclass(frozen=True, slots=True)
class PullLimits:
    max_batch: int
    max_expires_seconds: int
    max_waiting: int


@dataclass(frozen=True, slots=True)
class PullRequest:
    batch: int = 1
    max_bytes: int | None = None
    expires: float = 30.0
    no_wait: bool = False
    incremental_timeout: int = 0


@dataclass(frozen=True, slots=True)
class PullResult:
    jobs: list[PulledJob]
    pending: int


class AckItem(NamedTuple):
    id: int
    type: AckType
    attempt: int | None = None
    delay: float | None = None
    reason: str | None = None


class AckResult(enum.Enum):
    """What became of one ack; each transport says it its own way (HTTP status, NATS)."""

    DONE = "done"  # acked, nak'ed or terminated
    EXTENDED = "extended"  # in progress: the lease runs from now
    UNKNOWN_JOB = "unknown job"
    NOT_INFLIGHT = "not in flight"
    STALE_ATTEMPT = "stale attempt"
    REPEATED = "named twice"  # the same job twice in one batch

    @property
    def applied(self) -> bool:
        return self in (AckResult.DONE, AckResult.EXTENDED)


class AckOutcome(NamedTuple):
    id: int
    result: AckResult
    detail: str = ""
    lease_expires_at: datetime | None = None


def parse_job_id(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise NotFound(f"job {raw!r} not found") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise NotFound(f"job {raw!r} not found")
    return value
