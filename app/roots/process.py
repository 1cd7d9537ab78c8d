"""What every process shares: the database, its wake-ups, metrics, the token key, a life cycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from app.bridge.advisories import advisory_link
from app.config import Config
from app.domain.errors import Unavailable
from app.metrics import Metrics
from app.services.advisories import Advisories
from app.services.job_status import JobStatusQueries
from app.services.push import push_targets
from app.services.reads import Reads
from app.services.seeding import apply_seed
from app.services.signals import Signals
from app.services.tokens import TokenKeys
from app.store import attempts
from app.store.db import Database
from app.store.listener import NotifyListener
from app.store.replica import replica_database

log = logging.getLogger(__name__)

# How long a starting process waits for the database before it gives up (exit 1).
START_WAIT_SECONDS = 60.0


class Process:
    """One process's shared parts; started and stopped exactly once. Subclasses add the
    services their process runs and start its background tasks in `_run`."""

    config: Config
    # Only processes with waiters (API long polls, dispatcher, bridge) need NOTIFY wake-ups.
    listen: bool
    # A NATS connection of its own for advisories (API processes, sweepers; the bridge
    # publishes on its connection), when [nats] is configured.
    nats_advisories: bool
    signals: Signals
    db: Database
    metrics: Metrics
    tokens: TokenKeys
    advisories: Advisories
    job_status: JobStatusQueries
    # Reads that may go to [rdbms] replica-url (the primary's without one).
    reads: Reads
    listener: NotifyListener | None

    def __init__(self, config: Config, *, listen: bool, nats_advisories: bool) -> None:
        self.config = config
        self.listen = listen
        self.nats_advisories = nats_advisories
        self.signals = Signals()
        # Every process that ends attempts writes their history to this length.
        attempts.keep(config.ui.attempts_kept)
        self.db = Database.from_config(config.database, waker=self.signals)
        self.metrics = Metrics()
        # Channel and producer tokens are stored hashed: the key is read at start.
        self.tokens = TokenKeys(self.db, config.http.token_hash_key)
        # JetStream advisories: published once a NATS publisher is attached (see start()).
        self.advisories = Advisories()
        self.reads = Reads(
            self.db,
            replica_database(config.database),
            config.database.replica_max_lag_seconds,
            observe_read=self.metrics.read_served,
            observe_lag=self.metrics.replica_lag_measured,
        )
        self.job_status = JobStatusQueries(self.db, self.reads)
        self.listener = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closers: list[Callable[[], Awaitable[None]]] = []

    async def start(self, *, seed: bool = True) -> None:
        await self._prepare(seed=seed)
        if self.listen and self.config.database.dialect == "postgresql":
            self.listener = NotifyListener(self.config.database.connection_url, self.signals)
            self.spawn(self.listener.run, "notify-listener")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listener.ready.wait(), timeout=10)
        if self.reads.replica is not None:
            self.spawn(self.reads.watch, "replica-lag")
        if self.nats_advisories and self.config.nats.configured:
            nats, advisories = self.config.nats, self.advisories
            self.spawn(
                lambda stop: advisory_link(nats, advisories, stop, "webhook-broker"), "advisories"
            )
        self._run()

    def _run(self) -> None:
        """The process's own background tasks (none here)."""

    async def _prepare(self, *, seed: bool) -> None:
        """The token key and the seed, once the database answers: a process started while it
        restarts (a deployment coming up, a crash of both) waits for it rather than exiting."""
        deadline = time.monotonic() + START_WAIT_SECONDS
        while True:
            try:
                await self.tokens.load()
                if seed:
                    await apply_seed(self.db, self.config.seed, self.tokens.digest)
                return
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise
                log.warning("the database is unavailable; waiting for it to start")
                await asyncio.sleep(1)

    async def scrape(self) -> bytes:
        """The process's metrics; the database-read series at most every few seconds."""
        if self.metrics.stale():
            self.metrics.refreshed(
                await self.job_status.by_consumer(),
                await push_targets(self.db),
                await self.job_status.ledger(),
            )
        return self.metrics.render()

    def spawn(self, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]], name: str) -> None:
        """A background task, given the event that tells it the process stops."""
        self._tasks.append(asyncio.create_task(run(self._stop), name=name))

    def close_with(self, close: Callable[[], Awaitable[None]]) -> None:
        """Something to close once the tasks ended, before the database."""
        self._closers.append(close)

    async def _close(self) -> None:
        """What a subclass ends before the tasks are awaited (waiting pulls)."""

    async def stop(self) -> None:
        self._stop.set()
        await self._close()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=10)
            for task in pending:
                task.cancel()
            self._tasks.clear()
        for close in self._closers:
            await close()
        await self.reads.close()
        await self.db.dispose()
