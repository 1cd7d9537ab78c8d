"""The hot paths on PostgreSQL as one statement each: publish, claim, ack.

Each runs alone in autocommit (`Database.run_alone`): one round trip, no BEGIN or COMMIT, no
SQL compilation. Credentials are checked inside the statement. When a statement changes
nothing (bad credentials, a repeated message id, a stale ack, nothing to claim) the service
falls back to the full transaction in the stores, which finds out why and says so. SQLite
always takes the full transactions.

Tokens are compared by the database here: the rows are found by their keys first, so the
comparison is one short string equality, not a lookup whose timing depends on the token.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.models import Message, PulledJob
from app.store.db import MAX_NOTIFY_PAYLOAD, NOTIFY_CHANNEL, Database
from app.store.jobs import DELIVERED, INFLIGHT, PENDING_COUNT_CAP, QUEUED

# -- publish -----------------------------------------------------------------------------------

# Credentials, the message, one QUEUED job per consumer of the channel, and the NOTIFY that
# wakes their waiters. No row back: bad credentials or a repeated message id.
PUBLISH_WITH_CREDENTIALS = f"""
WITH allowed AS (
    SELECT channel.id FROM channel JOIN producer ON producer.id = %(producer_id)s
    WHERE channel.id = %(channel_id)s AND channel.token = %(channel_token)s
      AND producer.token = %(producer_token)s
), stored AS (
    INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, priority,
                         headers, received_at)
    SELECT allowed.id, %(message_id)s, %(producer_id)s, %(payload)s, %(content_type)s,
           %(priority)s, %(headers)s::json, now()
    FROM allowed
    ON CONFLICT (channel_id, message_id) DO NOTHING
    RETURNING pk, received_at
), fanned AS (
    INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,
                     earliest_next_attempt_at, status_changed_at, created_at)
    SELECT stored.pk, consumer.pk, '{QUEUED}', %(priority)s, %(payload_size)s,
           stored.received_at, stored.received_at, stored.received_at
    FROM stored JOIN consumer ON consumer.channel_id = %(channel_id)s
    RETURNING consumer_pk
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


async def publish(
    db: Database,
    *,
    channel_id: str,
    channel_token: str,
    producer_id: str,
    producer_token: str,
    message_id: str,
    payload: bytes,
    content_type: str,
    priority: int,
    headers: dict[str, str],
) -> tuple[Message, list[int]] | None:
    """PostgreSQL only: the message and the consumers that got a job, or None (see above)."""
    rows = await db.run_alone(
        PUBLISH_WITH_CREDENTIALS,
        {
            "channel_id": channel_id,
            "channel_token": channel_token,
            "producer_id": producer_id,
            "producer_token": producer_token,
            "message_id": message_id,
            "payload": payload,
            "payload_size": len(payload),
            "content_type": content_type,
            "priority": priority,
            "headers": json.dumps(headers),
        },
    )
    if not rows:
        return None
    row = rows[0]
    stored = Message(
        pk=row[0],
        channel_id=channel_id,
        message_id=message_id,
        producer_id=producer_id,
        payload=payload,
        content_type=content_type,
        priority=priority,
        headers=headers,
        received_at=row[1],
    )
    return stored, list(row[2])


# -- who ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Named:
    """How a statement names its pull consumer: by credentials (a request) or by primary key
    (a waiting pull re-reading its consumer, the NATS bridge)."""

    consumer_pk: int | None = None
    channel_id: str = ""
    channel_token: str = ""
    consumer_id: str = ""
    consumer_token: str = ""

    @classmethod
    def by_credentials(
        cls, channel_id: str, channel_token: str, consumer_id: str, consumer_token: str
    ) -> Named:
        return cls(None, channel_id, channel_token, consumer_id, consumer_token)

    @property
    def key(self) -> str:
        return "pk" if self.consumer_pk is not None else "credentials"

    def params(self) -> dict[str, Any]:
        if self.consumer_pk is not None:
            return {"consumer_pk": self.consumer_pk}
        return {
            "channel_id": self.channel_id,
            "channel_token": self.channel_token,
            "consumer_id": self.consumer_id,
            "consumer_token": self.consumer_token,
        }


# The consumer row (pk, ack_wait_seconds, max_ack_pending) of a pull consumer, or no row.
NAMED = {
    "credentials": """
    SELECT consumer.pk, consumer.ack_wait_seconds, consumer.max_ack_pending
    FROM channel JOIN consumer ON consumer.channel_id = channel.id
    WHERE channel.id = %(channel_id)s AND channel.token = %(channel_token)s
      AND consumer.consumer_id = %(consumer_id)s AND consumer.token = %(consumer_token)s
      AND consumer.type = 'pull'""",
    "pk": """
    SELECT consumer.pk, consumer.ack_wait_seconds, consumer.max_ack_pending FROM consumer
    WHERE consumer.pk = %(consumer_pk)s AND consumer.type = 'pull'""",
}


# -- claim -------------------------------------------------------------------------------------

# The claim returns PulledJob's fields in their order, so each row is the record as it is:
# these from the message, the rest from the claimed job (the columns share the fields' names).
MESSAGE_COLUMNS = ("message_id", "payload", "content_type", "headers")
CLAIMED_COLUMNS = tuple(name for name in PulledJob._fields if name not in MESSAGE_COLUMNS)
PULLED_COLUMNS = tuple(
    f"message.{name}" if name in MESSAGE_COLUMNS else f"claimed.{name}"
    for name in PulledJob._fields
)
PULLED_WIDTH = len(PULLED_COLUMNS)

# The NATS bridge numbers its deliveries: one sequence value per claimed job, and the
# consumer's newest delivery remembered (never moving backwards).
NUMBERED = """, numbers AS (
    SELECT claimed.id, nextval('bridge_delivery_seq') AS seq FROM claimed
), recorded AS (
    INSERT INTO bridge_consumer (consumer_pk, last_delivery_seq, last_stream_seq,
                                 last_delivered_at)
    SELECT (SELECT pk FROM named), max(seq), (SELECT max(id) FROM claimed), now()
    FROM numbers HAVING count(*) > 0
    ON CONFLICT (consumer_pk) DO UPDATE SET
        last_delivery_seq = greatest(excluded.last_delivery_seq,
                                     bridge_consumer.last_delivery_seq),
        last_stream_seq = greatest(excluded.last_stream_seq, bridge_consumer.last_stream_seq),
        last_delivered_at = excluded.last_delivered_at
)"""


@functools.lru_cache(maxsize=1024)
def claim_sql(key: str, numbered: bool, limit: int) -> str:
    # `(SELECT pk FROM named)` is evaluated once and then acts as a parameter, so the claim
    # walks the partial claim index in order, as the stores' claim does. Consumers capped by
    # max-ack-pending are left to the full transaction, which counts their in-flight jobs
    # under a lock. The statement sees the queue as it was before it ran: the pending count
    # includes what it claimed and takes that off; only a full batch counts at all (a short
    # one left nothing due). The limit is written into the text: with LIMIT $n PostgreSQL
    # prices a generic plan for a tenth of the table, so it planned every claim anew (0.3 ms,
    # a tenth of the claim); a batch size of its own lets the generic plan win as it should.
    limit = int(limit)
    pulled_columns = ", ".join(PULLED_COLUMNS)
    returned = ", ".join(f"job.{name}" for name in [*CLAIMED_COLUMNS, "message_pk"])
    message_columns = ", ".join(f"message.{name}" for name in MESSAGE_COLUMNS)
    # One sequence value per row (an array on every row would cost the client n squared).
    seqs = "numbers.seq" if numbered else "NULL"
    join_numbers = "JOIN numbers ON numbers.id = claimed.id" if numbered else ""
    return f"""
WITH named AS ({NAMED[key]}
      AND consumer.max_ack_pending IS NULL
), due AS (
    SELECT job.id FROM job
    WHERE job.consumer_pk = (SELECT pk FROM named) AND job.status = '{QUEUED}'
      AND job.earliest_next_attempt_at <= now()
    ORDER BY job.priority DESC, job.id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE job SET status = '{INFLIGHT}', attempt = job.attempt + 1,
        incremental_timeout = %(incremental_timeout)s,
        lease_expires_at = now() + make_interval(secs => %(incremental_timeout)s
            + coalesce((SELECT ack_wait_seconds FROM named), %(default_ack_wait)s)),
        claimed_at = now(), status_changed_at = now()
    WHERE job.id IN (SELECT id FROM due) AND job.status = '{QUEUED}'
    RETURNING {returned}
), counted AS (
    SELECT count(*) AS n FROM claimed
){NUMBERED if numbered else ""}
SELECT {pulled_columns}, {seqs},
    CASE WHEN (SELECT n FROM counted) < {limit} THEN 0 ELSE greatest(0, (
        SELECT count(*) FROM (
            SELECT 1 FROM job
            WHERE job.consumer_pk = (SELECT pk FROM named) AND job.status = '{QUEUED}'
              AND job.earliest_next_attempt_at <= now()
            ORDER BY job.priority DESC, job.id
            LIMIT {PENDING_COUNT_CAP + limit}
        ) AS ahead) - (SELECT n FROM counted)) END
FROM claimed CROSS JOIN LATERAL (
    -- OFFSET 0 keeps this a per-row primary key lookup: a join would let stale statistics
    -- hash the whole message table for a few hundred rows.
    SELECT {message_columns} FROM message WHERE message.pk = claimed.message_pk OFFSET 0
) AS message {join_numbers}
ORDER BY claimed.priority DESC, claimed.id
"""


@dataclass(frozen=True, slots=True)
class Claimed:
    jobs: list[PulledJob]  # highest priority first, then oldest
    pending: int  # due jobs left, counted up to PENDING_COUNT_CAP
    seqs: list[int]  # numbered claims: the delivery sequence numbers, ascending


def _pulled_job(row: tuple[Any, ...]) -> PulledJob:
    job = PulledJob._make(row[:PULLED_WIDTH])
    # Binary results load json as Python objects; the text form only in case that changes.
    if type(job.headers) is not dict:
        headers = job.headers
        job = job._replace(headers=dict(json.loads(headers) if isinstance(headers, str) else {}))
    return job


async def claim(
    db: Database,
    named: Named,
    *,
    limit: int,
    default_ack_wait: int,
    incremental_timeout: int = 0,
    numbered: bool = False,
) -> Claimed:
    """Lease up to `limit` due jobs of an uncapped pull consumer. Nothing claimed says
    nothing about why: the caller's full transaction finds out."""
    params = named.params() | {
        "default_ack_wait": default_ack_wait,
        "incremental_timeout": incremental_timeout,
    }
    rows = await db.run_alone(claim_sql(named.key, numbered, limit), params)
    if not rows:
        return Claimed([], 0, [])
    last = rows[0]
    return Claimed(
        [_pulled_job(row) for row in rows],
        min(int(last[-1]), PENDING_COUNT_CAP),
        sorted(row[-2] for row in rows) if numbered else [],
    )


# -- ack ---------------------------------------------------------------------------------------


def _ack_sql(key: str, one: bool) -> str:
    # INFLIGHT -> DELIVERED for (id, attempt or None) pairs. A job not in the answer was not
    # acked: credentials, job, status or attempt were off.
    given = (
        "(SELECT %(id)s::bigint, %(attempt)s::integer)"
        if one
        else "unnest(%(ids)s::bigint[], %(attempts)s::integer[])"
    )
    return f"""
WITH named AS ({NAMED[key]}
), acked AS (
    UPDATE job SET status = '{DELIVERED}', lease_expires_at = NULL, status_changed_at = now()
    FROM named, {given} AS given(id, attempt)
    WHERE job.id = given.id AND job.consumer_pk = named.pk
      AND (job.status || '') = '{INFLIGHT}'  -- no status index: the primary key finds them
      AND (given.attempt IS NULL OR job.attempt = given.attempt)
    RETURNING job.id, named.pk, named.max_ack_pending
), told AS (
    -- Pulls of a consumer capped by max-ack-pending wait for in-flight jobs to end.
    SELECT pg_notify('{NOTIFY_CHANNEL}', CAST(pk AS text)) FROM acked
    WHERE max_ack_pending IS NOT NULL LIMIT 1
)
SELECT id, (SELECT count(*) FROM told) AS told FROM acked
"""


# One ack has a statement of its own, with plain parameters. With arrays, a generic plan
# assumes ten elements, a custom plan for one is always cheaper, and so every single ack was
# planned anew (0.2 ms, three times the cost of running it). Batches keep the generic plan
# whatever their size: the primary key finds each job, so 1,000 acks run as fast with it as
# with a plan made for them.
ACK = {(key, one): _ack_sql(key, one) for key in NAMED for one in (False, True)}


async def ack(db: Database, named: Named, targets: Sequence[tuple[int, int | None]]) -> set[int]:
    """Plain acks of (job id, attempt or None) pairs; the ids that moved."""
    if len(targets) == 1:
        ((job_id, attempt),) = targets
        rows = await db.run_alone(
            ACK[named.key, True], named.params() | {"id": job_id, "attempt": attempt}
        )
        return {row[0] for row in rows}
    rows = await db.run_alone(
        ACK[named.key, False],
        named.params() | {"ids": [i for i, _ in targets], "attempts": [a for _, a in targets]},
    )
    return {row[0] for row in rows}
