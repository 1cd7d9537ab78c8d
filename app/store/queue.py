"""The queue's contended statements, each written once per dialect: publish with fan-out,
claim (pull, push and the NATS bridge's numbered claim), and ack (INFLIGHT -> DELIVERED).

`Queue` is the one entry to them; the services never choose between copies.

- PostgreSQL: one text per statement, below. `Database.run` executes it either alone
  (autocommit, one round trip, prepared; on a pooled connection, or on connections a hot
  loop holds, `Held`: the push dispatcher's) or inside a transaction when the use case needs more
  (a max-ack-pending consumer locks its row and counts its in-flight jobs first): the same
  text either way. Credentials are checked inside the statement, so a hot request is one
  round trip.
- SQLite: the same steps in SQLAlchemy Core, always in a transaction (SQLite serialises
  writers, so nothing there is contended in the same way).

A statement that changes nothing says nothing about why (bad credentials, a repeated message
id, a stale ack, nothing due): the services then ask read-only queries, and never run a
second copy of the write. Tokens are compared by the database, here and in
`app/store/stakeholders.py`: the rows are found by their keys first, so each comparison is one
short string equality.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from sqlalchemy import and_, select
from sqlalchemy.engine import Row

from app.domain.counters import COUNTER_SHARDS
from app.domain.errors import Conflict
from app.domain.jobs import JobStatus
from app.domain.models import ConsumerType, Message, Observe, PulledJob, ignore
from app.store import attempts
from app.store.bridge import BridgeStore
from app.store.db import MAX_NOTIFY_PAYLOAD, NOTIFY_CHANNEL, Database, Held, Tx
from app.store.jobs import DELIVERED, INFLIGHT, PENDING_COUNT_CAP, QUEUED, JobStore
from app.store.messages import MessageStore
from app.store.pauses import NOT_PAUSED_SQL, not_paused
from app.store.schema import channel, consumer, producer

# -- who ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Named:
    """How a statement names its consumers: one pull consumer by credentials (a request), one
    consumer by primary key (a waiting pull, the bridge, the seed API, a push outcome), or one
    push consumer by primary key for the dispatcher's claim (`dispatch`: its lease, no
    max-ack-pending cap, which is a pull setting, and no pending count)."""

    consumer_pk: int | None = None
    channel_id: str = ""
    channel_token: str = ""
    consumer_id: str = ""
    consumer_token: str = ""
    type: ConsumerType = ConsumerType.PULL
    dispatch: bool = False

    @classmethod
    def by_credentials(
        cls, channel_id: str, channel_token: str, consumer_id: str, consumer_token: str
    ) -> Named:
        return cls(None, channel_id, channel_token, consumer_id, consumer_token)

    @classmethod
    def push(cls, consumer_pk: int) -> Named:
        return cls(consumer_pk, type=ConsumerType.PUSH, dispatch=True)

    @property
    def key(self) -> str:
        if self.dispatch:
            return "push"
        return "pk" if self.consumer_pk is not None else "credentials"

    def params(self) -> dict[str, Any]:
        if self.dispatch:
            return {"consumer_pk": self.consumer_pk}
        if self.consumer_pk is not None:
            return {"consumer_pk": self.consumer_pk, "consumer_type": self.type.value}
        return {
            "channel_id": self.channel_id,
            "channel_token": self.channel_token,
            "consumer_id": self.consumer_id,
            "consumer_token": self.consumer_token,
        }


@dataclass(frozen=True, slots=True)
class Claimed:
    jobs: list[PulledJob]  # highest priority first, then oldest
    pending: int  # due jobs left, counted up to PENDING_COUNT_CAP
    seqs: list[int]  # numbered claims: the delivery sequence numbers, ascending


NOTHING = Claimed([], 0, [])


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to publish, with the credentials the statement checks."""

    channel_id: str
    channel_token: str
    producer_id: str
    producer_token: str
    message_id: str
    payload: bytes
    content_type: str
    priority: int
    headers: dict[str, str]
    scheduled_for: datetime | None = None  # its jobs fall due then


@dataclass(frozen=True, slots=True)
class Published:
    message: Message
    consumer_pks: list[int]  # the consumers that got a job


# -- PostgreSQL: the texts ---------------------------------------------------------------------

# The consumer rows (pk, ack_wait_seconds, max_ack_pending) a statement acts for, or no row.
NAMED = {
    "credentials": """
    SELECT consumer.pk, consumer.ack_wait_seconds, consumer.max_ack_pending
    FROM channel JOIN consumer ON consumer.channel_id = channel.id
    WHERE channel.id = %(channel_id)s AND channel.token = %(channel_token)s
      AND consumer.consumer_id = %(consumer_id)s AND consumer.token = %(consumer_token)s
      AND consumer.type = 'pull'""",
    "pk": """
    SELECT consumer.pk, consumer.ack_wait_seconds, consumer.max_ack_pending FROM consumer
    WHERE consumer.pk = %(consumer_pk)s AND consumer.type = %(consumer_type)s""",
    "push": """
    SELECT consumer.pk, consumer.ack_wait_seconds, consumer.max_ack_pending FROM consumer
    WHERE consumer.pk = %(consumer_pk)s AND consumer.type = 'push'""",
}

# Credentials, the message, one QUEUED job per consumer of the channel, its count in the
# delivery ledger, and the NOTIFY that wakes their waiters. No row back: bad credentials or a
# repeated message id.
PUBLISH = f"""
WITH allowed AS (
    SELECT channel.id, channel.generation
    FROM channel JOIN producer ON producer.id = %(producer_id)s
    WHERE channel.id = %(channel_id)s AND channel.token = %(channel_token)s
      AND producer.token = %(producer_token)s
), keyed AS (
    -- The duplicate check, exact across the message table's partitions (message_key,
    -- migration 0020): the key takes the message's pk, so a repeat writes no message.
    INSERT INTO message_key (channel_id, message_id, message_pk)
    SELECT allowed.id, %(message_id)s, nextval('message_pk_seq') FROM allowed
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING message_pk
), stored AS (
    INSERT INTO message (pk, channel_id, message_id, producer_id, payload, content_type,
                         priority, headers, received_at, scheduled_for)
    SELECT keyed.message_pk, allowed.id, %(message_id)s, %(producer_id)s, %(payload)s,
           %(content_type)s, %(priority)s, %(headers)s::json, now(),
           %(scheduled_for)s::timestamptz
    FROM allowed, keyed
    RETURNING pk, received_at, scheduled_for
), fanned AS (
    INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                     earliest_next_attempt_at, status_changed_at, created_at)
    SELECT stored.pk, consumer.pk, '{QUEUED}', %(priority)s, %(payload_size)s,
           coalesce(stored.scheduled_for, stored.received_at), stored.received_at,
           stored.received_at
    FROM stored JOIN consumer ON consumer.channel_id = %(channel_id)s
        AND consumer.backfill_next IS NULL  -- still copying its history: app/bridge/backfill
    RETURNING consumer_pk
), counted AS (
    -- The delivery ledger (app/store/ledger.py): under the generation read in the snapshot
    -- that chose the consumers above.
    INSERT INTO published_count (channel_id, generation, shard, n)
    SELECT allowed.id, allowed.generation, pg_backend_pid() %% {COUNTER_SHARDS}, 1
    FROM allowed, stored
    ON CONFLICT (channel_id, generation, shard) DO UPDATE SET n = published_count.n + 1
), told AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}',
                     CASE WHEN length(pks) <= {MAX_NOTIFY_PAYLOAD} THEN pks ELSE '*' END)
    FROM (SELECT string_agg(CAST(consumer_pk AS text), ',') AS pks FROM fanned) AS listed
    WHERE pks IS NOT NULL
)
SELECT stored.pk, stored.received_at, ARRAY(SELECT consumer_pk FROM fanned),
       (SELECT count(*) FROM told)
FROM stored
"""

# The claim returns PulledJob's fields in their order, so each row is the record as it is:
# these from the message, the rest from the claimed job (the columns share the fields' names).
MESSAGE_COLUMNS = ("message_id", "payload", "content_type", "headers")
CLAIMED_COLUMNS = tuple(name for name in PulledJob._fields if name not in MESSAGE_COLUMNS)
PULLED_COLUMNS = tuple(
    f"message.{name}" if name in MESSAGE_COLUMNS else f"claimed.{name}"
    for name in PulledJob._fields
)
PULLED_WIDTH = len(PULLED_COLUMNS)

# The NATS bridge numbers its deliveries per consumer (1, 2, 3 ... as JetStream does): the
# consumer's counter moves on by the number claimed, and each job, in queue order, takes its
# number below the new value. The upsert locks the consumer's counter row, so claims of one
# consumer running side by side number one after the other (the second reads the first's
# committed value), and claims of different consumers never meet.
NUMBERED = """, counter AS (
    INSERT INTO bridge_consumer (consumer_pk, last_delivery_seq, last_stream_seq,
                                 last_delivered_at)
    SELECT (SELECT pk FROM named), n, (SELECT max(message_pk) FROM claimed), now()
    FROM counted WHERE n > 0
    ON CONFLICT (consumer_pk) DO UPDATE SET
        last_delivery_seq = bridge_consumer.last_delivery_seq + excluded.last_delivery_seq,
        last_stream_seq = greatest(excluded.last_stream_seq, bridge_consumer.last_stream_seq),
        last_delivered_at = excluded.last_delivered_at
    RETURNING last_delivery_seq
), numbers AS (
    SELECT claimed.id, (SELECT last_delivery_seq FROM counter) - (SELECT n FROM counted)
        + row_number() OVER (ORDER BY claimed.priority DESC, claimed.id) AS seq
    FROM claimed
)"""


@functools.lru_cache(maxsize=64)
def claim_sql(key: str, *, numbered: bool, by_bytes: bool, capped: bool) -> str:
    """The claim, in the variant a call needs (each variant is its own prepared statement).

    `(SELECT pk FROM named)` is evaluated once and then acts as a parameter, so the claim
    walks the partial claim index in order. Run alone, it leaves consumers capped by
    max-ack-pending alone (`capped` False): their claims run in a transaction that has locked
    the consumer row and counted its in-flight jobs, with the limit that leaves. The
    statement sees the queue as it was before it ran: the pending count includes what it
    claimed and takes that off; when fewer rows were due than the limit, none is left but
    those a byte budget passed over. The limit is a parameter (`%(limit)s`): the walk's
    LIMIT is inside `claimable_jobs`, planned there once (migration 0010), so no estimate of
    this statement depends on it and its generic plan is the custom plans' own. Written into
    the text, every batch size was a statement of its own, prepared on each pooled connection
    separately: a third to a half of the bridge's claims were planned anew.
    """
    push = key == "push"
    pulled_columns = ", ".join(PULLED_COLUMNS)
    # PulledJob carries message_pk (the bridge's stream sequence): named once.
    returned = ", ".join(f"job.{name}" for name in dict.fromkeys([*CLAIMED_COLUMNS, "message_pk"]))
    # The headers as their text: psycopg's json loader decoded each row's bytes even for the
    # '{}' most messages carry (a sixth of the dispatcher's claim, in its Python thread).
    message_columns = ", ".join(
        f"message.{name}::text AS {name}" if name == "headers" else f"message.{name}"
        for name in MESSAGE_COLUMNS
    )
    # Push consumers all lease for the dispatcher's time; a pull consumer may set its own.
    ack_wait = (
        "%(default_ack_wait)s"
        if push
        else "coalesce((SELECT ack_wait_seconds FROM named), %(default_ack_wait)s)"
    )
    uncapped = "" if capped or push else "\n      AND consumer.max_ack_pending IS NULL"
    # A paused consumer is not found: every claim leases nothing for it (app/store/pauses).
    uncapped += f"\n      AND {NOT_PAUSED_SQL}"
    if key == "credentials":
        # A request's own claim (HTTP, before the consumer is read) leaves consumers with a
        # priority policy alone, as capped ones: their requests go through the scheduler.
        uncapped += "\n      AND consumer.priority_policy = 'none'"
    # A byte budget keeps the longest prefix of the locked rows that fits (at least one job);
    # the rows it passes over are unlocked when the statement or transaction ends.
    chosen = (
        """, chosen AS (
    SELECT id FROM (
        SELECT id, row_number() OVER w AS n, sum(payload_size) OVER w AS total
        FROM due WINDOW w AS (ORDER BY priority DESC, id)
    ) AS running WHERE n = 1 OR total <= %(max_bytes)s
)"""
        if by_bytes
        else ""
    )
    # One sequence value per row (an array on every row would cost the client n squared).
    seqs = "numbers.seq" if numbered else "NULL"
    join_numbers = "JOIN numbers ON numbers.id = claimed.id" if numbered else ""
    # The count ahead as a subquery: run once, where a bare call ran once a returned row.
    pending = (
        "0"
        if push
        else f"""CASE WHEN (SELECT count(*) FROM due) < %(limit)s
        THEN (SELECT count(*) FROM due) - (SELECT n FROM counted)
        ELSE greatest(0,
            (SELECT due_jobs_ahead((SELECT pk FROM named), {PENDING_COUNT_CAP} + %(limit)s))
            - (SELECT n FROM counted)) END"""
    )
    return f"""
WITH named AS ({NAMED[key]}{uncapped}
), due AS (
    -- The queue's first due jobs, locked (migration 0010_claim_functions: walked in the
    -- index's order whatever the statistics expect).
    SELECT id, priority, payload_size FROM claimable_jobs((SELECT pk FROM named), %(limit)s)
){chosen}, claimed AS (
    UPDATE job SET status = '{INFLIGHT}', attempt = job.attempt + 1,
        incremental_timeout = %(incremental_timeout)s,
        lease_expires_at = now() + make_interval(secs => %(incremental_timeout)s + {ack_wait}),
        claimed_at = now(), status_changed_at = now()
    WHERE job.id IN (SELECT id FROM {"chosen" if by_bytes else "due"})
      AND (job.status || '') = '{QUEUED}'  -- no status index: the primary key finds them
    RETURNING {returned}
), counted AS (
    SELECT count(*) AS n FROM claimed
){NUMBERED if numbered else ""}
SELECT {pulled_columns}, {seqs}, {pending}
FROM claimed CROSS JOIN LATERAL (
    -- OFFSET 0 keeps this a per-row primary key lookup: a join would let stale statistics
    -- hash the whole message table for a few hundred rows.
    SELECT {message_columns} FROM message WHERE message.pk = claimed.message_pk OFFSET 0
) AS message {join_numbers}
ORDER BY claimed.priority DESC, claimed.id
"""


@functools.lru_cache(maxsize=64)
def ack_sql(key: str, one: bool, kept: int, note: str = attempts.ACKED) -> str:
    # INFLIGHT -> DELIVERED for (id, attempt or None) pairs. A job not in the answer was not
    # acked: credentials, job, status or attempt were off.
    given = (
        "(SELECT %(id)s::bigint, %(attempt)s::integer)"
        if one
        else "unnest(%(ids)s::bigint[], %(attempts)s::integer[])"
    )
    # `(SELECT pk FROM named)` is found once; joined to `given`, the consumer was looked up
    # again for every job acked.
    return f"""
WITH named AS ({NAMED[key]}
), acked AS (
    UPDATE job SET status = '{DELIVERED}', lease_expires_at = NULL, status_changed_at = now(),
        -- The attempt's end in its history (app/store/attempts.py), kept() entries at most.
        attempts = {attempts.append_sql(note, kept)}
    FROM {given} AS given(id, attempt)
    WHERE job.id = given.id AND job.consumer_pk = (SELECT pk FROM named)
      AND (job.status || '') = '{INFLIGHT}'  -- no status index: the primary key finds them
      AND (given.attempt IS NULL OR job.attempt = given.attempt)
    RETURNING job.id
), told AS (
    -- Pulls of a consumer capped by max-ack-pending wait for in-flight jobs to end.
    SELECT pg_notify('{NOTIFY_CHANNEL}', CAST(pk AS text)) FROM named
    WHERE max_ack_pending IS NOT NULL AND EXISTS (SELECT FROM acked)
)
SELECT id, (SELECT count(*) FROM told) AS told FROM acked
"""


# One ack has a statement of its own, with plain parameters. With arrays, a generic plan
# assumes ten elements, a custom plan for one is always cheaper, and so every single ack was
# planned anew (0.2 ms, three times the cost of running it). Batches keep the generic plan
# whatever their size: the primary key finds each job, so 1,000 acks run as fast with it as
# with a plan made for them. (ACK: the texts as the default configuration writes them, for the
# bench's scripts.)
ACK = {
    (key, one): ack_sql(key, one, attempts.DEFAULT_KEPT)
    for key in ("credentials", "pk")
    for one in (False, True)
}


def int_array(values: Sequence[int | None]) -> str:
    """An integer array's literal, for a `%(name)s::bigint[]` or `::integer[]` parameter (None:
    NULL). psycopg adapts a list element by element in Python: 1.4 us a job of a 64-job ack,
    against a tenth of that for one join."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


_HEADERS_AT = PulledJob._fields.index("headers")


def _pulled_job(row: tuple[Any, ...]) -> PulledJob:
    text = row[_HEADERS_AT]
    headers = dict(json.loads(text) or {}) if text and text != "{}" else {}
    return PulledJob._make((*row[:_HEADERS_AT], headers, *row[_HEADERS_AT + 1 : PULLED_WIDTH]))


# -- the queue ---------------------------------------------------------------------------------


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _measured(
    name: str, jobs: Callable[[Any], int]
) -> Callable[
    [Callable[Concatenate[Queue, _P], Coroutine[Any, Any, _R]]],
    Callable[Concatenate[Queue, _P], Coroutine[Any, Any, _R]],
]:
    """Time a queue statement and count the jobs it moved, for the metrics."""

    def wrap(
        method: Callable[Concatenate[Queue, _P], Coroutine[Any, Any, _R]],
    ) -> Callable[Concatenate[Queue, _P], Coroutine[Any, Any, _R]]:
        @functools.wraps(method)
        async def measured(self: Queue, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            started = time.perf_counter()
            result = await method(self, *args, **kwargs)
            self._timed(name, time.perf_counter() - started)
            moved = jobs(result)
            if moved:
                self._observe(name, moved)
            return result

        return measured

    return wrap


class Queue:
    """Publish, claim and ack on either database; `tx` runs a statement inside a transaction
    the caller holds (None: on its own, on a pooled connection or on `held` ones)."""

    def __init__(
        self,
        db: Database,
        observe: Observe = ignore,
        timed: Callable[[str, float], None] = lambda _statement, _seconds: None,
        held: Held | None = None,
    ) -> None:
        self._db = db
        self._held = held
        self._postgres = db.dialect == "postgresql"
        self._observe = observe  # (transition kind, jobs): the metrics' count of each
        self._timed = timed  # (statement, seconds): the metrics' latency of each

    async def _run(
        self,
        sql: str,
        params: dict[str, Any],
        tx: Tx | None = None,
        *,
        prepare: bool | None = None,
    ) -> list[tuple[Any, ...]]:
        if tx is None and self._held is not None:
            return await self._held.run(sql, params, prepare=prepare)
        return await self._db.run(sql, params, tx, prepare=prepare)

    @_measured("publish", lambda published: len(published.consumer_pks) if published else 0)
    async def publish(self, new: NewMessage) -> Published | None:
        """The message and its jobs, or None: bad credentials, a repeated message id, or a
        consumer deleted while the statement ran (its snapshot still named the consumer, whose
        row was gone when the job's foreign key was checked; nothing was stored, and the next
        run no longer sees it)."""
        if not self._postgres:
            async with self._db.transaction() as tx:
                published = await _sqlite_publish(tx, new)
                if published is not None:
                    tx.announce(published.consumer_pks)
            return published
        try:
            rows = await self._run(
                PUBLISH,
                {
                    "channel_id": new.channel_id,
                    "channel_token": new.channel_token,
                    "producer_id": new.producer_id,
                    "producer_token": new.producer_token,
                    "message_id": new.message_id,
                    "payload": new.payload,
                    "payload_size": len(new.payload),
                    "content_type": new.content_type,
                    "priority": new.priority,
                    "headers": json.dumps(new.headers),
                    "scheduled_for": new.scheduled_for,
                },
            )
        except psycopg.errors.ForeignKeyViolation:
            return None
        if not rows:
            return None
        pk, received_at, consumer_pks, _ = rows[0]
        self._db.wake_here(consumer_pks)
        message = Message(
            pk=pk,
            channel_id=new.channel_id,
            message_id=new.message_id,
            producer_id=new.producer_id,
            payload=new.payload,
            content_type=new.content_type,
            priority=new.priority,
            headers=new.headers,
            received_at=received_at,
            scheduled_for=new.scheduled_for,
        )
        return Published(message, list(consumer_pks))

    @_measured("claim", lambda claimed: len(claimed.jobs))
    async def claim(
        self,
        named: Named,
        *,
        limit: int,
        default_ack_wait: int,
        incremental_timeout: int = 0,
        max_bytes: int | None = None,
        max_ack_pending: int | None = None,
        numbered: bool = False,
        tx: Tx | None = None,
    ) -> Claimed:
        """Lease up to `limit` due jobs, highest priority first, oldest first within one.

        Without `max_ack_pending` a consumer capped by it is left alone (nothing claimed):
        the caller, having read the consumer, claims again with its cap, which locks the
        consumer row and counts its in-flight jobs in the same transaction first."""
        if max_ack_pending is not None and tx is None:
            async with self._db.transaction() as own:
                # The statement itself, not measured twice.
                return await Queue.claim.__wrapped__(  # type: ignore[attr-defined,no-any-return]
                    self,
                    named,
                    limit=limit,
                    default_ack_wait=default_ack_wait,
                    incremental_timeout=incremental_timeout,
                    max_bytes=max_bytes,
                    max_ack_pending=max_ack_pending,
                    numbered=numbered,
                    tx=own,
                )
        if max_ack_pending is not None:
            assert tx is not None and named.consumer_pk is not None
            jobs = JobStore(tx)
            limit = min(limit, max_ack_pending - await jobs.inflight_locked(named.consumer_pk))
            if limit <= 0:
                return Claimed([], await jobs.due_count(named.consumer_pk, PENDING_COUNT_CAP), [])
        if not self._postgres:
            if tx is not None:
                return await _sqlite_claim(
                    tx, named, limit, default_ack_wait, incremental_timeout, max_bytes,
                    capped=max_ack_pending is not None, numbered=numbered,
                )  # fmt: skip
            async with self._db.transaction() as own:
                return await _sqlite_claim(
                    own, named, limit, default_ack_wait, incremental_timeout, max_bytes,
                    capped=False, numbered=numbered,
                )  # fmt: skip
        sql = claim_sql(
            named.key,
            numbered=numbered,
            by_bytes=max_bytes is not None,
            capped=max_ack_pending is not None,
        )
        params = named.params() | {
            "limit": limit,
            "default_ack_wait": default_ack_wait,
            "incremental_timeout": incremental_timeout,
            "max_bytes": max_bytes,
        }
        # Prepared at its first run on a connection, not its sixth: the five runs before were
        # each planned, on every connection of the pool (the claim's plan does not depend on
        # its parameters, so PostgreSQL keeps the generic one after its five custom plans).
        rows = await self._run(sql, params, tx, prepare=True)
        if not rows:
            return NOTHING
        return Claimed(
            [_pulled_job(row) for row in rows],
            min(int(rows[0][-1]), PENDING_COUNT_CAP),
            sorted(row[-2] for row in rows) if numbered else [],
        )

    @_measured("ack", len)
    async def ack(
        self,
        named: Named,
        targets: Sequence[tuple[int, int | None]],
        tx: Tx | None = None,
        *,
        note: str = attempts.ACKED,
    ) -> set[int]:
        """INFLIGHT -> DELIVERED for (job id, attempt or None) pairs; the ids that moved. `note`
        says how the attempt ended, for its history: attempts.ACKED or a push's status, never
        free text (PostgreSQL's statement carries it in its text)."""
        if not targets:
            return set()
        if not self._postgres:
            if tx is not None:
                return await _sqlite_ack(tx, named, targets, note)
            async with self._db.transaction() as own:
                return await _sqlite_ack(own, named, targets, note)
        if len(targets) == 1:
            ((job_id, attempt),) = targets
            params = named.params() | {"id": job_id, "attempt": attempt}
            rows = await self._run(ack_sql(named.key, True, attempts.kept(), note), params, tx)
        else:
            ids, tries = zip(*targets, strict=True)
            params = named.params() | {"ids": int_array(ids), "attempts": int_array(tries)}
            rows = await self._run(ack_sql(named.key, False, attempts.kept(), note), params, tx)
        return {row[0] for row in rows}


# -- SQLite: the same steps in SQLAlchemy Core ---------------------------------------------------


async def _sqlite_named(
    tx: Tx, named: Named, *, capped: bool, claim: bool = False
) -> Row[Any, Any, Any] | None:
    """The consumer row NAMED selects on PostgreSQL, with the same conditions (a claim's)."""
    query = select(consumer.c.pk, consumer.c.ack_wait_seconds, consumer.c.max_ack_pending)
    if named.consumer_pk is not None:
        query = query.where(consumer.c.pk == named.consumer_pk, consumer.c.type == named.type.value)
    else:
        query = query.join(channel, channel.c.id == consumer.c.channel_id).where(
            channel.c.id == named.channel_id,
            channel.c.token == named.channel_token,
            consumer.c.consumer_id == named.consumer_id,
            consumer.c.token == named.consumer_token,
            consumer.c.type == ConsumerType.PULL.value,
        )
        if claim:
            query = query.where(consumer.c.priority_policy == "none")
    if claim:
        query = query.where(not_paused(tx.dialect))
    if not capped:
        query = query.where(consumer.c.max_ack_pending.is_(None))
    return (await tx.conn.execute(query)).first()


async def _sqlite_publish(tx: Tx, new: NewMessage) -> Published | None:
    allowed = (
        select(channel.c.id)
        .join(producer, producer.c.id == new.producer_id)
        .where(
            and_(
                channel.c.id == new.channel_id,
                channel.c.token == new.channel_token,
                producer.c.token == new.producer_token,
            )
        )
    )
    if (await tx.conn.execute(allowed)).first() is None:
        return None
    try:
        message, consumer_pks = await MessageStore(tx).publish(
            channel_id=new.channel_id,
            producer_id=new.producer_id,
            message_id=new.message_id,
            payload=new.payload,
            content_type=new.content_type,
            priority=new.priority,
            headers=new.headers,
            scheduled_for=new.scheduled_for,
        )
    except Conflict:
        return None
    return Published(message, consumer_pks)


async def _sqlite_claim(
    tx: Tx,
    named: Named,
    limit: int,
    default_ack_wait: int,
    incremental_timeout: int,
    max_bytes: int | None,
    *,
    capped: bool,
    numbered: bool,
) -> Claimed:
    jobs = JobStore(tx)
    # A dispatcher's claim, as NAMED["push"]: the push consumer, uncapped, the given lease.
    row = await _sqlite_named(tx, named, capped=capped or named.dispatch, claim=True)
    if row is None:
        return NOTHING
    pks = [row.pk]
    ack_wait = default_ack_wait if named.dispatch else row.ack_wait_seconds or default_ack_wait
    due, claimed = await jobs.claim_sqlite(
        pks,
        limit=limit,
        ack_wait=ack_wait,
        incremental_timeout=incremental_timeout,
        max_bytes=max_bytes,
    )
    pulled = [PulledJob.of(c) for c in claimed]
    if named.dispatch or not pulled:
        return Claimed(pulled, 0, [])
    pending = due - len(pulled) if due < limit else await jobs.due_count(pks[0], PENDING_COUNT_CAP)
    seqs: list[int] = []
    if numbered:
        bridge = BridgeStore(tx)
        last_seq, _ = await bridge.last_sequences(pks[0])
        seqs = list(range(last_seq + 1, last_seq + len(pulled) + 1))
        await bridge.record_delivery(pks[0], seqs[-1], max(j.message_pk for j in pulled))
    return Claimed(pulled, pending, seqs)


async def _sqlite_ack(
    tx: Tx, named: Named, targets: Sequence[tuple[int, int | None]], note: str
) -> set[int]:
    row = await _sqlite_named(tx, named, capped=True)
    if row is None:
        return set()
    store = JobStore(tx)
    moved = {j.id for j in await store.complete(row.pk, targets, JobStatus.DELIVERED, note=note)}
    if moved and row.max_ack_pending is not None:
        tx.announce([row.pk])
    return moved
