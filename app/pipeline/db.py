"""PostgreSQL from the driver (psycopg) and the JDBC coordinates Spark's executors use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

import psycopg

# One archiver at a time; reports share the lock so they never see a batch half deleted.
# (8071950101 is the migration lock in migrations/env.py.)
PIPELINE_LOCK_KEY = 8071950102

LockMode = Literal["exclusive", "shared"]


class PipelineLocked(RuntimeError):
    """Another pipeline run holds the advisory lock."""


@dataclass(frozen=True, slots=True)
class JdbcTarget:
    url: str
    user: str
    password: str

    def options(self, fetch_size: int) -> dict[str, str]:
        opts = {"url": self.url, "driver": "org.postgresql.Driver", "fetchsize": str(fetch_size)}
        if self.user:
            opts["user"] = self.user
        if self.password:
            opts["password"] = self.password
        return opts


def jdbc_target(connection_url: str) -> JdbcTarget:
    """postgresql://user:pw@host:port/db?opts -> jdbc:postgresql://host:port/db?opts + creds."""
    parts = urlsplit(connection_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("the pipeline needs a postgresql:// connection URL")
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    query = f"?{parts.query}" if parts.query else ""
    return JdbcTarget(
        url=f"jdbc:postgresql://{host}{port}{parts.path}{query}",
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
    )


def connect(
    connection_url: str, *, autocommit: bool = False
) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(connection_url, autocommit=autocommit, application_name="wb-pipeline")
    # The archive's commits written before they return, whatever the server's default: a
    # replica the report then finds at the primary's written position holds every one of them
    # (app/pipeline/replica.py). A handful of commits a batch: the flush costs nothing.
    conn.execute("SET synchronous_commit = on")
    if not autocommit:
        conn.commit()
    return conn


@contextmanager
def pipeline_lock(connection_url: str, mode: LockMode) -> Iterator[None]:
    """Hold the pipeline's session-level advisory lock, or raise PipelineLocked at once."""
    suffix = "" if mode == "exclusive" else "_shared"
    with connect(connection_url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT pg_try_advisory_lock{suffix}(%s)", (PIPELINE_LOCK_KEY,)
        ).fetchone()
        if not row or not row[0]:
            raise PipelineLocked("another pipeline run holds the lock")
        try:
            yield
        finally:
            # The server drops a session's locks when its backend exits, which can be after
            # the client has closed and started the next run: that run would find the lock
            # still held. Unlocking is answered only once the lock is gone. (A broken
            # connection's backend is gone or going, and takes the lock with it.)
            with suppress(psycopg.Error):
                conn.execute(f"SELECT pg_advisory_unlock{suffix}(%s)", (PIPELINE_LOCK_KEY,))
