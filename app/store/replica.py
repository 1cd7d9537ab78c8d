"""The replica's engine and the two statements that measure its lag (app/domain/replica.py says
why WAL positions and not replay timestamps)."""

from __future__ import annotations

from dataclasses import replace

from app.config import DatabaseConfig
from app.store.db import Database

# Bytes since the start of the WAL: pg_lsn differences are numeric. The write position, not
# the insert position: an idle primary's insert position stands past a page header that no
# replica ever replays, so it would look behind forever.
PRIMARY_WAL_POSITION = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
# NULL when the server is not in recovery: not a standby (a promoted one, or a wrong URL).
REPLICA_REPLAY_POSITION = (
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() - '0/0'::pg_lsn END"
)

REPLICA_CONNECT_TIMEOUT_SECONDS = 3


def replica_database(config: DatabaseConfig) -> Database | None:
    """An engine and pool of its own on [rdbms] replica-url (None without one, or on SQLite).
    It has no waker: nothing is ever written through it."""
    replica = config.replica
    if replica is None:
        return None
    url = replica.connection_url
    if "connect_timeout=" not in url:
        # A replica host that drops packets must fail a read over to the primary in seconds,
        # not after the kernel's TCP timeout.
        url += ("&" if "?" in url else "?") + f"connect_timeout={REPLICA_CONNECT_TIMEOUT_SECONDS}"
    return Database.from_config(replace(replica, connection_url=url))


async def primary_position(primary: Database) -> int:
    (row,) = await primary.run_alone(PRIMARY_WAL_POSITION, {}, prepare=False)
    return int(row[0])


async def replay_position(replica: Database) -> int | None:
    """The replica's replay position, or None when it is not a standby."""
    (row,) = await replica.run_alone(REPLICA_REPLAY_POSITION, {}, prepare=False)
    return None if row[0] is None else int(row[0])
