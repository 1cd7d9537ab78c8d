"""Deterministic broker data written with plain SQL, with times the tests control."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

TOKENS = ("SECRET-CHANNEL-TOKEN-1", "SECRET-CHANNEL-TOKEN-2", "SECRET-PRODUCER-TOKEN")
CONSUMER_TOKEN = "SECRET-CONSUMER-TOKEN-{}"
CHANNELS = {"orders": ("billing", "shipping"), "users": ("crm",)}
NOW = datetime.now(UTC).replace(microsecond=0)


@dataclass(frozen=True)
class Dataset:
    old_terminal: list[int]  # message pks the archive must take
    old_open: list[int]  # old, but a job is still QUEUED or INFLIGHT
    recent: list[int]  # inside the retention window
    consumer_pks: dict[str, int]  # "channel/consumer" -> pk


def seed(url: str, *, old: int = 30, old_open: int = 4, recent: int = 6, seed: int = 7) -> Dataset:
    rng = random.Random(seed)
    with psycopg.connect(url) as conn:
        for i, (channel, consumers) in enumerate(CHANNELS.items()):
            conn.execute(
                "INSERT INTO channel (id, name, token, created_at, updated_at)"
                " VALUES (%s, %s, %s, now(), now())",
                (channel, channel.title(), TOKENS[i]),
            )
            for name in consumers:
                conn.execute(
                    "INSERT INTO consumer (channel_id, consumer_id, name, token, callback_url,"
                    " type, created_at, updated_at) VALUES (%s, %s, %s, %s, '', 'pull', now(),"
                    " now())",
                    (channel, name, name, CONSUMER_TOKEN.format(name)),
                )
        conn.execute(
            "INSERT INTO producer (id, name, token, created_at, updated_at)"
            " VALUES ('p1', 'P1', %s, now(), now())",
            (TOKENS[2],),
        )
        consumer_pks = {
            f"{c}/{k}": pk
            for pk, c, k in conn.execute("SELECT pk, channel_id, consumer_id FROM consumer")
        }
        kinds = ["old"] * old + ["open"] * old_open + ["recent"] * recent
        rng.shuffle(kinds)
        made: dict[str, list[int]] = {"old": [], "open": [], "recent": []}
        for n, kind in enumerate(kinds):
            age = timedelta(days=1) if kind == "recent" else timedelta(days=rng.uniform(9, 12))
            received = NOW - age + timedelta(microseconds=rng.randrange(1_000_000))
            channel = rng.choice(sorted(CHANNELS))
            pk = _message(conn, rng, n, channel, received)
            made[kind].append(pk)
            for k, name in enumerate(CHANNELS[channel]):
                still_open = kind == "open" and k == 0
                _job(conn, rng, pk, consumer_pks[f"{channel}/{name}"], received, still_open)
    return Dataset(made["old"], made["open"], made["recent"], consumer_pks)


def _message(
    conn: psycopg.Connection[Any], rng: random.Random, n: int, channel: str, received: datetime
) -> int:
    payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    headers = json.dumps({"X-Trace": f"t{n}", "note": "grüße ✓"})
    row = conn.execute(
        "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type,"
        " priority, headers, received_at) VALUES (%s, %s, 'p1', %s, 'application/octet-stream',"
        " %s, %s, %s) RETURNING pk",
        (channel, f"m-{n}", payload, rng.randrange(3), headers, received),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _job(
    conn: psycopg.Connection[Any],
    rng: random.Random,
    message_pk: int,
    consumer_pk: int,
    created: datetime,
    still_open: bool,
) -> None:
    claimed = created + timedelta(seconds=rng.uniform(0.01, 90))
    finished = claimed + timedelta(seconds=rng.uniform(0.001, 30))
    retries = rng.choice((0, 0, 0, 1, 2, 5))
    timeouts = rng.choice((0, 0, 1, 2))
    if still_open:
        status = rng.choice(("QUEUED", "INFLIGHT"))
    else:
        status = "DEAD" if rng.random() < 0.3 else "DELIVERED"
    never_claimed = status == "QUEUED" or (status == "DEAD" and rng.random() < 0.1)
    conn.execute(
        "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size, attempt,"
        " retry_count, timeout_count, incremental_timeout, lease_expires_at,"
        " earliest_next_attempt_at, claimed_at, status_changed_at, created_at, dead_reason,"
        " last_error) VALUES (%s, %s, %s, 1, 10, %s, %s, %s, 0, %s, %s, %s, %s, %s, %s, %s)",
        (
            message_pk,
            consumer_pk,
            status,
            0 if never_claimed else retries + 1,
            retries,
            timeouts,
            claimed + timedelta(seconds=60) if status == "INFLIGHT" else None,
            created,
            None if never_claimed else claimed,
            created if status == "QUEUED" else (claimed if status == "INFLIGHT" else finished),
            created,
            "term: bad payload" if status == "DEAD" else None,
            "HTTP 500" if retries else None,
        ),
    )
