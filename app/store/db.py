"""Engine, transactions and the dialect-specific time arithmetic used by every store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any, Literal, Protocol, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import ColumnElement, Float, Table, cast, event, func, literal_column, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.util import greenlet_spawn

from app.config import DatabaseConfig
from app.domain.errors import Contended, Unavailable, UnstorableValue

_T = TypeVar("_T")

NOTIFY_CHANNEL = "webhook_broker_jobs"
# A consumer's settings changed (callback URL, tokens, secret, type, enabled) or it went:
# dispatchers read their push consumers again before their next claim. A channel of its own,
# so that the many job wake-ups never cost a dispatcher a read of its consumers.
CHANGES_CHANNEL = "webhook_broker_consumers"


class Waker(Protocol):
    """Wakes local waiters of the given consumers (long polls, dispatchers)."""

    def wake(self, consumer_pks: Iterable[int]) -> None: ...

    def wake_all(self) -> None:
        """After a lost listener connection: notifications may have been missed."""

    def changed(self, consumer_pks: Iterable[int]) -> None:
        """These consumers' settings changed: what was read of them is stale."""


class Tx:
    """One open transaction, plus the consumers whose queues it changed."""

    def __init__(self, conn: AsyncConnection, dialect: str) -> None:
        self.conn = conn
        self.dialect = dialect
        self.announced: set[int] = set()
        self.changed: set[int] = set()

    def announce(self, consumer_pks: Iterable[int]) -> None:
        """Wake waiters of these consumers once this transaction commits."""
        self.announced.update(consumer_pks)

    def announce_change(self, consumer_pks: Iterable[int]) -> None:
        """These consumers' settings changed (or they were created or deleted): once this
        transaction commits, every process drops what it read of them, and their waiters wake
        to read them again."""
        pks = set(consumer_pks)
        self.changed.update(pks)
        self.announced.update(pks)


class Database:
    """The engine and the one way services open transactions."""

    def __init__(
        self,
        engine: AsyncEngine,
        dialect: str,
        url: str,
        waker: Waker | None = None,
        *,
        max_idle_seconds: float = 0,
        max_lifetime_seconds: float = 0,
        alone: int = 0,
    ) -> None:
        self.engine = engine
        self.dialect = dialect
        self.url = url  # as configured (held connections open with it)
        self.waker = waker
        self.max_idle_seconds = max_idle_seconds  # [rdbms] connxn-max-idle-time-seconds
        self.max_lifetime_seconds = max_lifetime_seconds  # [rdbms] connxn-max-lifetime-seconds
        # run_alone's own autocommit connections (see alone_share), or None.
        self._alone = self.held(alone) if alone > 0 else None

    @classmethod
    def from_config(cls, config: DatabaseConfig, waker: Waker | None = None) -> Database:
        alone = 0
        if config.dialect == "postgresql":
            alone, pool_size = alone_share(config.pool_size, config.max_overflow)
            config = replace(config, pool_size=pool_size)
        return cls(
            create_engine(config),
            config.dialect,
            config.connection_url,
            waker,
            max_idle_seconds=config.pool_max_idle_seconds,
            max_lifetime_seconds=config.pool_recycle_seconds,
            alone=alone,
        )

    async def in_transaction(self, work: Callable[[Tx], Awaitable[_T]]) -> _T:
        """`work` in one transaction, run again from the start when PostgreSQL rolled the
        transaction back to break a lock cycle (Contended): none of it stands then, and its
        statements are conditional, so the second run decides afresh. For transactions of
        several statements that lock jobs the way a client's request orders them (a batch of
        mixed acks): two such batches naming the same jobs can wait on each other."""

        async def once() -> _T:
            async with self.transaction() as tx:
                return await work(tx)

        return await settled_by_running_again(once)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        with driver_errors_as_domain():
            async with self._begin() as tx:
                yield tx
        # Changes first: a dispatcher that the wake-up starts must find its consumers stale.
        if tx.changed and self.waker is not None:
            self.waker.changed(tx.changed)
        if tx.announced:
            self.wake_here(tx.announced)

    @asynccontextmanager
    async def _begin(self) -> AsyncIterator[Tx]:
        async with self.engine.begin() as conn:
            tx = Tx(conn, self.dialect)
            yield tx
            if tx.changed and self.dialect == "postgresql":
                # Sent before the wake-up below: one transaction's notifications arrive in
                # the order sent, so a listener hears of the change before the jobs.
                await conn.execute(
                    text("SELECT pg_notify(:channel, :payload)"),
                    {"channel": CHANGES_CHANNEL, "payload": _payload(tx.changed)},
                )
            if tx.announced and self.dialect == "postgresql":
                # NOTIFY is delivered at commit, so a listener never sees uncommitted jobs.
                await conn.execute(
                    text("SELECT pg_notify(:channel, :payload)"),
                    {"channel": NOTIFY_CHANNEL, "payload": _payload(tx.announced)},
                )

    def wake_here(self, consumer_pks: Iterable[int]) -> None:
        """Wake this process's waiters now (NOTIFY reaches the others, and this one later)."""
        if self.waker is not None:
            self.waker.wake(consumer_pks)

    async def run(
        self,
        sql: str,
        params: dict[str, Any],
        tx: Tx | None = None,
        *,
        prepare: bool | None = None,
    ) -> list[tuple[Any, ...]]:
        """A PostgreSQL statement text (%(name)s placeholders), the same text either way:
        alone, or inside `tx` on that transaction's own driver connection. `prepare`: as
        `run_alone`'s."""
        if tx is None:
            return await self.run_alone(sql, params, prepare=prepare)
        with driver_errors_as_domain():
            raw = await tx.conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            return await execute(driver, sql, params, prepare)

    async def run_alone(
        self, sql: str, params: dict[str, Any], *, prepare: bool | None = None
    ) -> list[tuple[Any, ...]]:
        """One driver-level statement in its own implicit transaction (autocommit).

        For hot paths that fit one statement: no BEGIN and COMMIT round trips, and no SQL
        compilation. `sql` uses the driver's %(name)s placeholders. `prepare`: psycopg's
        (None: prepared once it has run a few times, then usually with a generic plan).
        """
        alone = self._alone
        if alone is not None and alone.free():
            # One of the process's own autocommit connections: no pool check-out, autocommit
            # switch or reset on return (docs/performance.md, "Why the hot paths look as they
            # do"). When all are busy, the statement runs on a pooled connection instead.
            return await alone.run(sql, params, prepare=prepare)
        return await settled_by_running_again(lambda: self._pooled(sql, params, prepare))

    async def _pooled(
        self, sql: str, params: dict[str, Any], prepare: bool | None
    ) -> list[tuple[Any, ...]]:
        # Straight from the pool to psycopg: a Connection and its execution options would
        # cost more Python than the statement takes on the server.
        with driver_errors_as_domain():
            raw = await self.engine.raw_connection()
            try:
                driver = raw.driver_connection
                assert driver is not None
                await driver.set_autocommit(True)
                rows = await execute(driver, sql, params, prepare)
                await driver.set_autocommit(False)
                return rows
            except BaseException:
                # The pool must never get back a connection left in autocommit or
                # mid-statement (cancelled): transactions would silently run statement by
                # statement on it.
                await greenlet_spawn(raw.invalidate)
                raise
            finally:
                await greenlet_spawn(raw.close)

    async def ping(self) -> None:
        """One trivial statement on a pooled connection; raises whatever the driver raises."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    def held(self, size: int) -> Held | None:
        """`size` autocommit connections of the caller's own, outside the pool (None on
        SQLite, whose one connection is the pool's)."""
        if self.dialect != "postgresql":
            return None
        return Held(
            libpq_url(self.url),
            size,
            max_idle_seconds=self.max_idle_seconds,
            max_lifetime_seconds=self.max_lifetime_seconds,
        )

    async def schema_revisions(self) -> frozenset[str]:
        """The Alembic revisions the database is at (empty before the first migration)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(text("SELECT version_num FROM alembic_version"))
            return frozenset(str(row[0]) for row in rows)

    async def dispose(self) -> None:
        alone, self._alone = self._alone, None  # later statements take the pool's path
        if alone is not None:
            await alone.close()
        await self.engine.dispose()


# At most this many of a process's connections are run_alone's own: enough for the hot
# statements a process runs at once on the bench's load; more of them run on pooled ones.
MAX_ALONE = 4


def alone_share(pool_size: int, max_overflow: int) -> tuple[int, int]:
    """How many of a PostgreSQL process's connections run_alone keeps to itself, and the pool
    size left for the rest, so that [rdbms] max-open-connxns (pool size + overflow) still
    bounds the connections open at once and max-idle-connxns (the pool size) those kept open.
    At most half of them and MAX_ALONE, and never the pool's last one."""
    alone = max(0, min(MAX_ALONE, (pool_size + max_overflow) // 2, pool_size - 1))
    return alone, pool_size - alone


async def execute(
    driver: psycopg.AsyncConnection[Any],
    sql: str,
    params: dict[str, Any],
    prepare: bool | None = None,
) -> list[tuple[Any, ...]]:
    """A statement on a driver connection, its rows (none for a statement without). Binary
    results: timestamps and payloads decode without text parsing. `prepare`: psycopg's (None:
    prepared once it has run a few times, then usually with a generic plan)."""
    async with driver.cursor() as cursor:
        await cursor.execute(sql, params, prepare=prepare, binary=True)
        # The result's status, not `cursor.description`, which builds a Column per column.
        result = cursor.pgresult
        if result is None or result.status != psycopg.pq.ExecStatus.TUPLES_OK:
            return []
        return await cursor.fetchall()


def libpq_url(connection_url: str) -> str:
    """The URL as libpq takes it (no SQLAlchemy driver suffix in the scheme)."""
    return "postgresql://" + connection_url.split("://", 1)[1]


CONNECT_TIMEOUT_SECONDS = 10


class Held:
    """A few autocommit driver connections that one hot loop keeps to itself (the push
    dispatcher's claims and acks): a statement runs without a pool check-out, a reset and an
    autocommit switch each side of it, which cost a dispatcher more of its Python thread than
    decoding the rows (docs/performance.md, "Why the hot paths look as they do"). Connections
    open on first use; one that fails (or whose statement is cancelled) is closed and opened
    again on the next use, and when one was dropped by the server, the others opened before it
    are replaced too; one unused for a while, or past its lifetime, is checked or replaced
    first, as the pool's are (idle_verdict). Also run_alone's own (Database)."""

    def __init__(
        self,
        url: str,
        size: int,
        *,
        max_idle_seconds: float = 0,
        max_lifetime_seconds: float = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._max_idle = max_idle_seconds
        self._max_lifetime = max_lifetime_seconds
        self._clock = clock
        self._used: dict[psycopg.AsyncConnection[Any], float] = {}  # when each went back
        # Every open connection: when it opened, and the generation it opened in.
        self._opened: dict[psycopg.AsyncConnection[Any], tuple[float, int]] = {}
        # Bumped when a connection turns out dropped by the server: the ones opened before
        # are replaced at their next use rather than failing a statement each (a restarted
        # database costs one failed statement, as the pool's invalidation does).
        self._generation = 0
        # A slot holds an open connection, or None: one to open when it is next used. Last in,
        # first out: the connection used last has the statements prepared (as the pool's).
        self._slots: asyncio.Queue[psycopg.AsyncConnection[Any] | None] = asyncio.LifoQueue()
        for _ in range(size):
            self._slots.put_nowait(None)
        self._closed = False
        # The URL's own connect_timeout, when it has one, wins (the keyword would override it).
        self._connect_options: dict[str, Any] = (
            {}
            if "connect_timeout" in conninfo_to_dict(url)
            else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
        )

    async def run(
        self, sql: str, params: dict[str, Any], *, prepare: bool | None = None
    ) -> list[tuple[Any, ...]]:
        """The statement (%(name)s placeholders), in its own implicit transaction. `prepare`:
        as `Database.run_alone`'s."""
        return await settled_by_running_again(lambda: self._run_once(sql, params, prepare))

    async def _run_once(
        self, sql: str, params: dict[str, Any], prepare: bool | None
    ) -> list[tuple[Any, ...]]:
        with driver_errors_as_domain():
            conn = await self._slots.get()
            kept: psycopg.AsyncConnection[Any] | None = None
            try:
                if self._closed:
                    raise psycopg.InterfaceError("the held connections are closed")
                if conn is not None and not conn.closed:
                    conn = await self._checked(conn)
                if conn is None or conn.closed:
                    if conn is not None:
                        self._forget(conn)
                    conn = await psycopg.AsyncConnection.connect(
                        self._url, autocommit=True, **self._connect_options
                    )
                    self._opened[conn] = (self._clock(), self._generation)
                    if self._closed:  # closed while this one was connecting
                        raise psycopg.InterfaceError("the held connections are closed")
                rows = await execute(conn, sql, params, prepare)
                kept = conn
                self._used[conn] = self._clock()
                return rows
            except psycopg.Error:
                if conn is not None and conn.broken:
                    self._generation += 1
                elif (
                    conn is not None
                    and not self._closed
                    and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                ):
                    # The statement failed, the connection did not (a bad value, a constraint):
                    # kept, so a client's bad input never costs a new backend.
                    kept = conn
                raise
            finally:
                # The slot goes back first, whatever closing a failed connection does.
                self._slots.put_nowait(kept)
                if kept is None and conn is not None:
                    self._forget(conn)
                    await conn.close()

    async def _checked(
        self, conn: psycopg.AsyncConnection[Any]
    ) -> psycopg.AsyncConnection[Any] | None:
        """`conn`, or None when it was unused too long, is past [rdbms]
        connxn-max-lifetime-seconds (as the pool recycles its own) or fails its check (then
        closed)."""
        now = self._clock()
        verdict = idle_verdict(now - self._used.get(conn, now), self._max_idle)
        opened, generation = self._opened.get(conn, (now, self._generation))
        if self._max_lifetime > 0 and now - opened > self._max_lifetime:
            verdict = "replace"
        if generation < self._generation:
            verdict = "replace"
        if verdict == "ping":
            try:
                await conn.execute("SELECT 1")
                return conn
            except psycopg.Error:
                pass
        elif verdict == "use":
            return conn
        self._forget(conn)
        await conn.close()
        return None

    def _forget(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._used.pop(conn, None)
        self._opened.pop(conn, None)

    def free(self) -> bool:
        """Whether a statement would start at once (a slot is free), not wait for one."""
        return not self._slots.empty()

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._opened):
            await conn.close()
        self._opened.clear()
        self._used.clear()


# A database that cannot be reached or that dropped the connection: raised by SQLAlchemy
# (wrapping the driver), by psycopg itself on the raw-connection paths, or by the pool.
_UNREACHABLE = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


# PostgreSQL's answers that roll a transaction back to settle a race with another one: a lock
# cycle (40P01, found after deadlock_timeout) or a serialization conflict (40001). Whatever the
# transaction did is undone, so it can run again (settled_by_running_again).
_CONTENDED = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
# Runs of a statement or transaction that meets one, in all: a third meeting another cycle
# means the workload keeps making them, which the client hears of (503) rather than waits on.
CONTENDED_ATTEMPTS = 3


def _contended(exc: BaseException) -> bool:
    return isinstance(getattr(exc, "orig", exc), _CONTENDED)  # SQLAlchemy wraps the driver's


async def settled_by_running_again(run: Callable[[], Awaitable[_T]]) -> _T:
    """`run` (one statement in its own transaction, or one whole transaction) again when
    PostgreSQL rolled it back to settle a race with another (Contended): nothing of it stands,
    and every state change is conditional, so the next run decides afresh. The other side of
    the race holds its locks until it commits; the next run waits for them as any statement
    does."""
    for attempt in range(1, CONTENDED_ATTEMPTS + 1):
        try:
            return await run()
        except Contended:
            if attempt == CONTENDED_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


@contextmanager
def driver_errors_as_domain() -> Iterator[None]:
    """The one driver-error boundary. A value the database cannot store or compare (a NUL in a
    text, a number past a column's range) came from a client, so it is that client's bad
    input, whichever entry point and driver ran the statement; a database that is down or
    restarting makes the request one to retry, not a server error. The driver's message is
    not passed on: it may quote parameters, tokens among them."""
    try:
        yield
    except (DataError, psycopg.DataError, OverflowError) as exc:
        raise UnstorableValue(
            "the request holds a value the database cannot store or compare"
        ) from exc
    except _UNREACHABLE as exc:
        if _contended(exc):
            raise Contended("the request met a lock conflict in the database; retry") from exc
        raise Unavailable("the database is unavailable; retry") from exc


# PostgreSQL refuses NOTIFY payloads of 8000 bytes or more; past this, wake every waiter.
MAX_NOTIFY_PAYLOAD = 7000


def _payload(consumer_pks: set[int]) -> str:
    payload = ",".join(str(pk) for pk in sorted(consumer_pks))
    return payload if len(payload) <= MAX_NOTIFY_PAYLOAD else "*"


# A pooled connection unused this long is checked with a round trip before it goes out. Handed
# out last-returned-first (below), the connections at the bottom of the pool sit unused through
# every lull, where a server's idle_session_timeout, a pooler or a NAT may drop them; a busy
# connection is never checked, so the hot path pays nothing.
IDLE_PING_SECONDS = 60.0

IdleVerdict = Literal["use", "ping", "replace"]


def idle_verdict(idle_seconds: float, max_idle_seconds: float) -> IdleVerdict:
    """What a connection unused for `idle_seconds` needs before it is handed out, under
    `[rdbms] connxn-max-idle-time-seconds` (0: no limit)."""
    if max_idle_seconds > 0 and idle_seconds > max_idle_seconds:
        return "replace"
    if idle_seconds >= IDLE_PING_SECONDS:
        return "ping"
    return "use"


class IdleGuard:
    """The pool's checkin/checkout hooks that apply idle_verdict. A connection to replace, or
    one whose check fails, is refused with DisconnectionError: the pool closes it and opens a
    new one for the same checkout."""

    def __init__(
        self, engine: AsyncEngine, max_idle_seconds: float, clock: Callable[[], float]
    ) -> None:
        self._dialect = engine.dialect
        self._max_idle = max_idle_seconds
        self._clock = clock

    def checkin(self, _dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = self._clock()

    def checkout(self, dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        since = record.info.pop("idle_since", None)
        if since is None:  # new: never handed out yet
            return
        verdict = idle_verdict(self._clock() - since, self._max_idle)
        if verdict == "replace":
            raise sa_exc.DisconnectionError("unused past [rdbms] connxn-max-idle-time-seconds")
        if verdict == "ping":
            try:
                self._dialect.do_ping(dbapi_connection)
            except Exception as exc:
                raise sa_exc.DisconnectionError("an idle connection failed its check") from exc


def create_engine(
    config: DatabaseConfig, *, clock: Callable[[], float] = time.monotonic
) -> AsyncEngine:
    if config.dialect == "sqlite":
        # One connection serialises SQLite access in this process; BEGIN IMMEDIATE takes the
        # write lock up front so other processes wait (busy_timeout) instead of failing on upgrade.
        engine = create_async_engine(
            config.sqlalchemy_url, pool_size=1, max_overflow=0, hide_parameters=True
        )
        event.listen(engine.sync_engine, "connect", _sqlite_on_connect)
        event.listen(engine.sync_engine, "begin", _sqlite_on_begin)
        return engine
    engine = create_async_engine(
        config.sqlalchemy_url,
        pool_size=config.pool_size,
        max_overflow=config.max_overflow,
        pool_recycle=config.pool_recycle_seconds or -1,
        # No pre-ping: it costs a round trip per transaction. A connection unused for a while
        # is checked instead (IdleGuard); one the server dropped while in use fails its
        # statement once, is discarded by the pool, and the next request gets a new one.
        pool_pre_ping=False,
        # The connection returned last goes out first: a hot statement is prepared (and its
        # generic plan made) on each connection it runs on, and handed out in turn (FIFO) every
        # connection of the pool stayed cold for it; LIFO keeps the busy ones few and warm.
        pool_use_lifo=True,
        # Statement parameters hold tokens; tracebacks of database errors must not show them.
        hide_parameters=True,
    )
    guard = IdleGuard(engine, config.pool_max_idle_seconds, clock)
    event.listen(engine.sync_engine.pool, "checkin", guard.checkin)
    event.listen(engine.sync_engine.pool, "checkout", guard.checkout)
    return engine


SQLITE_BUSY_TIMEOUT_MS = 10_000


def _sqlite_on_connect(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA journal_mode")
    if cursor.fetchone()[0] != "wal":
        _switch_to_wal(cursor)
    cursor.close()


def _switch_to_wal(cursor: Any) -> None:
    """WAL is kept in the file (migrations set it), so this runs for a file never migrated.
    The switch needs the database to itself and fails at once instead of waiting out the busy
    timeout, so connections opening one such file together retry it."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except Exception as exc:  # the driver's OperationalError, whichever adapter raised it
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.02)


def _sqlite_on_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def now(dialect: str) -> ColumnElement[Any]:
    """The database clock: timestamptz on PostgreSQL, epoch seconds on SQLite."""
    if dialect == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)")
    return func.now()


def plus_seconds(
    dialect: str, moment: ColumnElement[Any], seconds: ColumnElement[Any] | int | float
) -> ColumnElement[Any]:
    if dialect == "sqlite":
        return moment + seconds
    return moment + cast(seconds, Float) * literal_column("interval '1 second'")


def upsert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into `table` that takes ON CONFLICT DO UPDATE, in the dialect's construct
    (both databases have the clause; SQLAlchemy spells it per dialect)."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)
