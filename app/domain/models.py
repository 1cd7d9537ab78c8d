"""Frozen domain records handed between layers (no SQLAlchemy in here).

The records built once per job on the hot paths (Job, Message, ClaimedJob, PulledJob) are
NamedTuples: as immutable as frozen dataclasses, and built about six times faster (a frozen
dataclass sets each field through object.__setattr__).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, NamedTuple, TypeVar

from app.domain.jobs import JobStatus
from app.domain.priority import NO_PRIORITY, PrioritySettings

T = TypeVar("T")


# Ids, names and tokens are VARCHAR(255) columns; PostgreSQL refuses longer values.
MAX_FIELD_LENGTH = 255


class ConsumerType(enum.StrEnum):
    PUSH = "push"
    PULL = "pull"


@dataclass(frozen=True, slots=True)
class Stakeholder:
    """A channel or a producer: a public id, a display name and a secret token."""

    id: str
    name: str
    token: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class PushSettings:
    """A push consumer's signing secrets and limits (None: the config's default)."""

    signing_secret: str | None = None
    previous_signing_secret: str | None = None
    previous_secret_until: datetime | None = None
    max_in_flight: int | None = None
    rate_limit: float | None = None  # deliveries per second


class Breaker(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"  # no deliveries until open_until
    HALF_OPEN = "half_open"  # one probe delivery decides


@dataclass(frozen=True, slots=True)
class PushState:
    """What the dispatchers learned of a push consumer's endpoint."""

    disabled_at: datetime | None = None
    disabled_reason: str | None = None
    breaker: Breaker = Breaker.CLOSED
    failures: int = 0  # consecutive
    trips: int = 0  # times opened since it last closed
    open_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """Settings a consumer made or changed over NATS may carry (migration 0013; None: the
    broker's default). `backoff` is in seconds: the ack wait of each delivery, as JetStream's
    consumer backoff; `max_deliver` -1 is unlimited."""

    max_deliver: int | None = None
    max_waiting: int | None = None
    backoff: tuple[int, ...] = ()
    description: str | None = None
    metadata: dict[str, str] | None = None
    deliver_policy: str | None = None
    # Migration 0014: made without a durable name; 'none' acknowledges nothing (None:
    # explicit); deleted after `inactive_threshold` ns unused (None: never).
    ephemeral: bool = False
    ack_policy: str | None = None
    inactive_threshold: int | None = None
    # Migration 0016: a push consumer over NATS: the bridge delivers its jobs to
    # `deliver_subject` (a queue group `deliver_group` splits them), with idle heartbeats every
    # `idle_heartbeat` ns and nats-server's flow control.
    deliver_subject: str | None = None
    deliver_group: str | None = None
    idle_heartbeat: int | None = None
    flow_control: bool = False
    # Migration 0017: the start a history deliver policy was created with; mem_storage as
    # asked; `backfilling`: the channel's stored messages are still being copied to it.
    opt_start_seq: int | None = None
    opt_start_time: datetime | None = None
    mem_storage: bool = False
    backfilling: bool = False


@dataclass(frozen=True, slots=True)
class Consumer:
    pk: int
    id: str
    channel_id: str
    name: str
    token: str
    callback_url: str
    type: ConsumerType
    ack_wait_seconds: int | None
    max_ack_pending: int | None
    created_at: datetime
    updated_at: datetime
    priority: PrioritySettings = NO_PRIORITY
    push: PushSettings = field(default_factory=lambda: PushSettings())
    options: ConsumerOptions = field(default_factory=lambda: ConsumerOptions())
    paused_until: datetime | None = None  # claims and pushes stop until then

    def ack_wait(self, default: int) -> int:
        """Seconds a claim leases a job for: the consumer's own ack wait, or the broker's."""
        return self.ack_wait_seconds or default

    def paused_at(self, moment: datetime) -> bool:
        """Paused at `moment` (a pause whose time passed is over, as JetStream's)."""
        return self.paused_until is not None and self.paused_until > moment


class Message(NamedTuple):
    pk: int
    channel_id: str
    message_id: str
    producer_id: str
    payload: bytes
    content_type: str
    priority: int
    headers: dict[str, str]
    received_at: datetime
    scheduled_for: datetime | None = None  # its jobs fall due then, not at once


class Job(NamedTuple):
    id: int
    message_pk: int
    consumer_pk: int
    status: JobStatus
    priority: int
    attempt: int
    retry_count: int
    incremental_timeout: int
    lease_expires_at: datetime | None
    earliest_next_attempt_at: datetime
    status_changed_at: datetime
    created_at: datetime
    dead_reason: str | None = None
    last_error: str | None = None


class ClaimedJob(NamedTuple):
    """A job leased to a puller, with the message it carries."""

    job: Job
    message: Message


class PulledJob(NamedTuple):
    """What a pull consumer receives of a leased job (HTTP pull, the NATS bridge): the hot
    claim reads these columns and no others, half of a job and its message."""

    id: int
    attempt: int
    priority: int
    lease_expires_at: datetime | None
    created_at: datetime
    message_id: str
    payload: bytes
    content_type: str
    headers: dict[str, str]
    consumer_pk: int = 0  # the push dispatcher claims for many consumers at once
    # The message's position in its channel: the NATS bridge's stream sequence.
    message_pk: int = 0

    @classmethod
    def of(cls, claimed: ClaimedJob) -> PulledJob:
        job, message = claimed
        return cls(
            job.id,
            job.attempt,
            job.priority,
            job.lease_expires_at,
            job.created_at,
            message.message_id,
            message.payload,
            message.content_type,
            message.headers,
            job.consumer_pk,
            message.pk,
        )


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a keyset-paginated list; cursors are opaque strings."""

    items: list[T]
    next_cursor: str | None = None
    previous_cursor: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page starts: after `next` or before `previous` (at most one is set); opaque
    to clients."""

    next: str | None = None
    previous: str | None = None


@dataclass(frozen=True, slots=True)
class StreamState:
    """A channel seen as a JetStream stream (STREAM.INFO): its messages, and the job ids (the
    stream sequences the bridge hands out) of its pull consumers."""

    created: datetime
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    first_at: datetime | None
    last_at: datetime | None
    consumers: int


@dataclass(frozen=True, slots=True)
class StatusCount:
    channel_id: str
    consumer_id: str
    status: str
    count: int
    oldest: datetime | None  # created_at of the (consumer, status)'s first job by id
    newest: datetime | None  # ... and of its last


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A consumer's delivery ledger (app/store/ledger.py): the jobs it was owed by publishes,
    those deleted on purpose, and those it holds (every status, scheduled ones included)."""

    channel_id: str
    consumer_id: str
    published: int
    removed: int
    held: int

    @property
    def unaccounted(self) -> int:
        """0 when it adds up; above 0: jobs lost; below: jobs made twice."""
        return self.published - self.removed - self.held


@dataclass(frozen=True, slots=True)
class DeadCount:
    channel_id: str
    channel_name: str
    consumer_id: str
    consumer_name: str
    count: int


@dataclass(frozen=True, slots=True)
class Redrive:
    """A background move of a consumer's DEAD (or DELIVERED) jobs back to QUEUED."""

    id: int
    consumer_pk: int
    from_status: JobStatus
    changed_since: datetime | None
    changed_until: datetime | None
    per_second: int
    status: str  # RUNNING, COMPLETED, CANCELLED
    total: int  # the matching jobs when it began
    moved: int
    cursor: int
    upper_id: int
    created_at: datetime
    finished_at: datetime | None

    @property
    def chunk(self) -> int:
        """Jobs per step: a tenth of a second's worth (at most 1,000 per statement)."""
        return max(1, min(1000, -(-self.per_second // 10)))


# Told of each batch of job transitions as it happens: (kind, how many jobs). Kinds: publish,
# claim, ack, nak, term, progress, lease_expiry_requeue, dead_letter, redrive. The metrics
# count them (app/metrics.py); nothing else depends on it.
Observe = Callable[[str, int], None]


def ignore(kind: str, count: int) -> None:
    """The observer of a part built without metrics."""
