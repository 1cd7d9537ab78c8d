"""Session fixtures: a real PostgreSQL (or WEBHOOK_BROKER_TEST_DATABASE_URL), migrated templates,
and per-test fresh databases on PostgreSQL and SQLite, driven through real HTTP (ASGI)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from app.api.app import create_app
from app.config import Config, load_config_text
from app.runtime import Runtime
from app.store.migrate import upgrade
from devtools.pg import Cluster

# One template per test process (pytest-xdist runs several): on a shared server
# (WEBHOOK_BROKER_TEST_DATABASE_URL) each makes its own, and drops it when its session ends.
TEMPLATE_DB = f"wb_template_{os.getpid()}"
_counter = itertools.count()


def _db_url(base: str, name: str) -> str:
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}"


@pytest.fixture(scope="session")
def pg_base_url() -> Iterator[str]:
    given = os.environ.get("WEBHOOK_BROKER_TEST_DATABASE_URL")
    if given:
        yield given
        return
    cluster = Cluster(shared_buffers="128MB", statements=False)
    cluster.start()
    url = cluster.base_url
    try:
        yield url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_template(pg_base_url: str) -> Iterator[str]:
    """A database migrated once by Alembic; each test clones it (CREATE DATABASE ... TEMPLATE)."""
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    url = _db_url(pg_base_url, TEMPLATE_DB)
    upgrade(load_config_text(_rdbms("postgresql", url)).database)
    yield url
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")


@pytest.fixture(scope="session")
def sqlite_template() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="wb-sqlite-"))
    template = root / "template.sqlite3"
    upgrade(load_config_text(_rdbms("sqlite", str(template))).database)
    yield template
    shutil.rmtree(root, ignore_errors=True)


def _rdbms(dialect: str, url: str) -> str:
    return f"[rdbms]\ndialect={dialect}\nconnection-url={url}\n"


def fresh_database(backend: str, pg_base_url: str | None, sqlite_template: Path | None) -> str:
    """A new, migrated, empty database for one test; returns the [rdbms] section for it."""
    n = next(_counter)
    if backend == "postgresql":
        assert pg_base_url is not None
        name = f"wb_test_{os.getpid()}_{n}"
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
        return _rdbms("postgresql", _db_url(pg_base_url, name))
    assert sqlite_template is not None
    target = sqlite_template.parent / f"test-{n}.sqlite3"
    shutil.copy(sqlite_template, target)
    return _rdbms("sqlite", str(target))


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def rdbms(backend: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for the test, dropped afterwards so the session ends quickly."""
    if backend == "postgresql":
        request.getfixturevalue("pg_template")
        base = request.getfixturevalue("pg_base_url")
        section = fresh_database(backend, base, None)
        yield section
        name = section.rstrip().rpartition("/")[2]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        return
    section = fresh_database(backend, None, request.getfixturevalue("sqlite_template"))
    yield section
    path = Path(section.rstrip().rpartition("connection-url=")[2])
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)


@pytest.fixture
def extra_config() -> str:
    """Tests override this to add sections (seeds, [pull] limits ...) to the config."""
    return ""


@pytest.fixture
def config(rdbms: str, extra_config: str) -> Config:
    return load_config_text(rdbms + extra_config)


@pytest.fixture
async def runtime(config: Config) -> AsyncIterator[Runtime]:
    rt = Runtime(config)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


@pytest.fixture
async def client(config: Config, runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(config, runtime)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
        yield http
