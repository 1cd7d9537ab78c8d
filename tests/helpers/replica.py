"""A primary of a test module's own with a real streaming replica (pg_basebackup), and a fresh
database a test, copied from a migrated template on the primary: so that pausing the
replica's replay or stopping it touches no other test's database."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from app.config import load_config_text
from app.store.migrate import upgrade
from devtools.pg import Cluster
from tests.helpers.waiting import eventually_sync

_numbers = itertools.count()


@dataclass
class Pair:
    primary: Cluster
    replica: Cluster
    template: str


def rdbms_section(url: str, replica_url: str = "", max_lag: float | None = None) -> str:
    """The [rdbms] section for a database on the primary, read from the replica if given."""
    section = f"[rdbms]\ndialect=postgresql\nconnection-url={url}\n"
    if replica_url:
        section += f"replica-url={replica_url}\n"
    if max_lag is not None:
        section += f"replica-max-lag={max_lag}s\n"
    return section


@contextmanager
def primary_with_replica(
    template: str,
    *,
    statements: bool = False,
    prepare: Callable[[psycopg.Connection], None] | None = None,
) -> Iterator[Pair]:
    """`prepare` runs on the template before it is migrated (what every copy should hold)."""
    primary = Cluster(shared_buffers="64MB", statements=statements)
    primary.start()
    replica: Cluster | None = None
    try:
        with psycopg.connect(primary.base_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {template}")
        if prepare is not None:
            with psycopg.connect(primary.url(template), autocommit=True) as conn:
                prepare(conn)
        upgrade(load_config_text(rdbms_section(primary.url(template))).database)
        replica = primary.standby()
        yield Pair(primary, replica, template)
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


@contextmanager
def fresh_database(pair: Pair, prefix: str) -> Iterator[str]:
    """A copy of the template on the primary, returned once the replica has replayed it too
    (a read of the replica meanwhile would find no such database and fall back to the
    primary, which is not what a test of replica reads means to see)."""
    name = f"{prefix}_{next(_numbers)}"
    with psycopg.connect(pair.primary.base_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {pair.template}")

    def replayed() -> bool:
        with psycopg.connect(pair.replica.base_url, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            return found.fetchone() is not None

    eventually_sync(replayed, what=f"the replica's copy of database {name}")
    try:
        yield name
    finally:
        with psycopg.connect(pair.primary.base_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pause_replay(pair: Pair) -> None:
    """Stop the replica applying WAL (it keeps receiving), and return once it has stopped."""
    with psycopg.connect(pair.replica.base_url, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")

        def paused() -> bool:
            row = conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()
            return row is not None and row[0] == "paused"

        # Requested is not yet paused: a record may still be replayed until it is.
        eventually_sync(paused, what="the replica's replay paused")


def resume_replay(pair: Pair) -> None:
    with psycopg.connect(pair.replica.base_url, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_resume()")


def with_statements(conn: psycopg.Connection) -> None:
    """A `prepare` for primary_with_replica: every copy of the template counts its statements
    (the cluster loads pg_stat_statements with `statements=True`)."""
    conn.execute("CREATE EXTENSION pg_stat_statements")


def statement_calls(server: Cluster, database: str, marker: str) -> int:
    """Calls of statements with `marker` in their text, in `database`, on that server."""
    with psycopg.connect(server.url(database), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)"
            " AND query LIKE %s",
            (database, f"%{marker}%"),
        ).fetchone()
    assert row is not None
    return int(row[0])


def replayed(pair: Pair, database: str) -> None:
    """Return once the replica has the primary's `database` as it is now."""
    with psycopg.connect(pair.primary.url(database), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None

    def reached() -> bool:
        with psycopg.connect(pair.replica.base_url, autocommit=True) as conn:
            got = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
            ).fetchone()
        return bool(got and got[0])

    eventually_sync(reached, what="the replica replayed the set-up")
