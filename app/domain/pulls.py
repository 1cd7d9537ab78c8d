"""What pull consumers ask for and get back, whichever transport carries it (HTTP, NATS)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from app.domain.errors import NotFound
from app.domain.jobs import AckType
from app.domain.models import PulledJob
from app.domain.priority import PLAIN, PullPriority

# Job ids are BIGINT: anything larger names no job.
MAX_JOB_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ConsumerCredentials:
    channel_id: str
    channel_token: str | None
    consumer_id: str
    consumer_token: str | None
    # The admin token (or, for reads, the reader token) stood in for both tokens.
    operator: bool = False

    @property
    def complete(self) -> bool:
        """Both tokens given: only then can one statement check them and do the work."""
        return self.channel_token is not None and self.consumer_token is not None


# The shortest idle heartbeat a streaming pull may ask for, over HTTP and over the bridge: a
# shorter one is a stream of heartbeats, not a pull.
MIN_HEARTBEAT_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class PullLimits:
    max_batch: int
    max_stream_batch: int
    max_expires_seconds: int
    max_waiting: int
    # Payload bytes a streaming pull holds unwritten before it takes no more.
    max_stream_buffer_bytes: int = 8_388_608


@dataclass(frozen=True, slots=True)
class PullRequest:
    batch: int = 1
    max_bytes: int | None = None
    expires: float = 30.0
    no_wait: bool = False
    incremental_timeout: int = 0
    terms: PullPriority = PLAIN
    stream: bool = False  # jobs as they are claimed, until batch, max_bytes or expires
    idle_heartbeat: float | None = None  # a stream's heartbeat after this many idle seconds


@dataclass(frozen=True, slots=True)
class PullResult:
    jobs: list[PulledJob]
    pending: int
    pin_id: str | None = None  # pinned_client: the pin the jobs were handed out under


class Delivery(NamedTuple):
    """One claimed job on its way to a waiting request."""

    job: PulledJob
    seq: int  # the delivery (consumer) sequence number; 0 when the claim was not numbered
    pending: int  # due jobs not yet delivered after this one
    pin: str | None = None  # pinned_client: the pin it is handed out under (Nats-Pin-Id)


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    deliveries: list[Delivery]
    due: int  # due jobs left after the claim, counted up to the store's cap
    last_seq: int
    last_stream_seq: int

    @classmethod
    def numbered(cls, claimed: list[PulledJob], due: int, seqs: list[int] | None) -> ClaimBatch:
        count = len(claimed)
        numbers = seqs if seqs else [0] * count
        deliveries = [
            Delivery(job, seq, due + count - 1 - index)
            for index, (job, seq) in enumerate(zip(claimed, numbers, strict=True))
        ]
        return cls(
            deliveries,
            due,
            numbers[-1] if numbers else 0,
            max((job.message_pk for job in claimed), default=0),
        )


# JetStream's status text for a pull whose next message is larger than its MaxBytes.
MESSAGE_SIZE_EXCEEDS_MAX_BYTES = "Message Size Exceeds MaxBytes"


def exceeds_max_bytes(size: int, bytes_left: int | None) -> bool:
    """The one rule of every pull transport (HTTP, streaming, JetStream): a job larger than
    what the request has left of its max_bytes is not handed out. A request that got nothing
    ends with a 409 MESSAGE_SIZE_EXCEEDS_MAX_BYTES; one that got jobs ends with them."""
    return bytes_left is not None and size > bytes_left


class PullEnd(enum.Enum):
    """How a waiting pull request ended; each transport says it its own way."""

    FILLED = "batch filled"
    DELIVERED = "delivered"  # a request that ends with its first hand-out (HTTP long poll)
    EXPIRED = "expired"
    NO_MESSAGES = "no messages"  # no_wait, and nothing (more) is due
    TOO_LARGE = "next job exceeds max_bytes"
    BYTES_LEFT = "batch filled within max_bytes"  # filled with byte budget to spare
    CONSUMER_DELETED = "consumer deleted"
    DROPPED = "dropped"  # nobody to answer: requester gone, link down, shutting down
    PIN_MISMATCH = "another client holds the pin"  # pinned_client: said when it arrives
    WRONG_PIN = "the pin it names is no longer held"  # pinned_client: said at a dispatch


class AckItem(NamedTuple):
    id: int
    type: AckType
    attempt: int | None = None
    delay: float | None = None
    reason: str | None = None
    counted: bool = True  # a nak that counts a retry (False: handed back unprocessed)


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
