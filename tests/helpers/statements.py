"""A throwaway PostgreSQL cluster that loads pg_stat_statements, with one migrated database that
has the extension: for tests that count what the database ran (the suite's shared cluster runs
without it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from app.config import load_config_text
from app.store.migrate import upgrade
from devtools.pg import Cluster


@contextmanager
def counted_database(name: str) -> Iterator[tuple[Cluster, str]]:
    """The cluster and the URL of database `name` on it, migrated, pg_stat_statements created."""
    cluster = Cluster(shared_buffers="128MB", statements=True)
    cluster.start()
    try:
        with psycopg.connect(cluster.base_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = cluster.url(name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        upgrade(load_config_text(f"[rdbms]\ndialect=postgresql\nconnection-url={url}\n").database)
        yield cluster, url
    finally:
        cluster.stop()
