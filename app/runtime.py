"""The composition root: builds the database, wake-up plumbing and services for one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from app.bridge.advisories import advisory_link
from app.config import Config
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.http import Poster
from app.domain.callbacks import CallbackPolicy
from app.domain.errors import Unavailable
from app.domain.pulls import PullLimits
from app.metrics import Metrics
from app.services.acking import AckService
from app.services.admin import AdminService
from app.services.advisories import Advisories
from app.services.claiming import ClaimSource
from app.services.health import HealthService
from app.services.job_status import JobStatusQueries
from app.services.messages import MessageQueries
from app.services.pinning import PinService
from app.services.publishing import PublishingService
from app.services.pulling import PullService
from app.services.push import BreakerSettings, PushService
from app.services.redrives import RedriveService
from app.services.scheduler import PullScheduler
from app.services.seed_jobs import SeedJobService
from app.services.seeding import apply_seed
from app.services.signals import Signals
from app.services.sweeping import SweepService
from app.services.tokens import TokenKeys
from app.store.db import Database
from app.store.listener import NotifyListener
from app.store.migrate import head_revisions
from app.store.queue import Queue
from app.sweeper.redrives import RedriveRunner
from app.sweeper.runner import Sweeper

log = logging.getLogger(__name__)

# How long a starting process waits for the database before it gives up (exit 1).
START_WAIT_SECONDS = 60.0


@dataclass
class Runtime:
    """Everything one process shares across requests; started and stopped exactly once."""

    config: Config
    run_sweeper: bool = False
    run_dispatcher: bool = False
    # Only processes with waiters (API long polls, dispatcher, bridge) need NOTIFY wake-ups.
    listen: bool = True
    # A NATS connection of its own for advisories (API processes, sweepers; the bridge
    # publishes on its connection), when [nats] is configured.
    nats_advisories: bool = False
    signals: Signals = field(default_factory=Signals)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        config = self.config
        self.db = Database.from_config(config.database, waker=self.signals)
        self.metrics = Metrics()
        self.queue = Queue(self.db, self.metrics.transition, self.metrics.statement)
        ack_wait = config.default_ack_wait_seconds
        # Channel and producer tokens are stored hashed: the key is read at start.
        self.tokens = TokenKeys(self.db, config.http.token_hash_key)
        self.admin = AdminService(
            self.db,
            self.tokens,
            config.push.signing_secret_overlap_seconds,
            callbacks=CallbackPolicy.of(
                config.push.deny_callback_networks,
                deny_private=config.push.deny_private_callbacks,
                allow=config.push.allow_callback_networks,
            ),
        )
        # JetStream advisories: published once a NATS publisher is attached (see start()).
        self.advisories = Advisories()
        self.pins = PinService(self.db, self.advisories)
        self.publishing = PublishingService(
            self.db,
            self.queue,
            config.broker.max_message_size_bytes,
            min_schedule_delay=config.min_schedule_delay_minutes * 60,
            token_header=config.consumer_connection.token_header_name,
        )
        self.messages = MessageQueries(self.db)
        self.health = HealthService(self.db, head_revisions(config.database))
        self.job_status = JobStatusQueries(self.db)
        self.redrives = RedriveService(self.db, self.metrics.transition)
        self.claims = ClaimSource(self.db, self.queue, ack_wait, self.advisories)
        # One scheduler for every waiting pull of the process: HTTP long polls and the NATS
        # bridge's requests share max_waiting and each consumer's claims.
        self.scheduler = PullScheduler(
            self.claims,
            self.signals,
            max_claim=config.pull.max_batch,
            max_waiting=config.pull.max_waiting,
            max_waiting_total=config.pull.max_waiting_total,
            observe_end=self.metrics.pull_ended,
        )
        self.pulls = PullService(
            self.db,
            self.queue,
            self.claims,
            self.scheduler,
            PullLimits(
                max_batch=config.pull.max_batch,
                max_stream_batch=config.pull.max_stream_batch,
                max_expires_seconds=config.pull.max_expires_seconds,
                max_waiting=config.pull.max_waiting,
                max_stream_buffer_bytes=config.pull.max_stream_buffer_bytes,
            ),
        )
        self.acks = AckService(
            self.db,
            self.queue,
            config.broker.retry_policy,
            ack_wait,
            config.pull.max_batch,
            self.metrics.transition,
        )
        self.seed_jobs = SeedJobService(self.db, self.queue, ack_wait)
        self.sweeps = SweepService(
            self.db,
            config.broker.retry_policy,
            config.pull.sweep_batch_size,
            self.advisories,
            self.metrics.transition,
        )
        # The dispatcher's claims and acks run on connections of its own (store/db.Held), two:
        # its claiming loop and its recorder of answers each run a statement at a time. They
        # open on first use.
        self._dispatch_connections = self.db.held(2)
        self.push = PushService(
            self.db,
            Queue(
                self.db,
                self.metrics.transition,
                self.metrics.statement,
                held=self._dispatch_connections,
            ),
            config.broker.retry_policy,
            ack_wait,
            BreakerSettings(config.push.breaker_failures, config.push.breaker_cooldown_seconds),
        )
        self.metrics.watch_waiting(self.scheduler.waiting_total)
        self._draining = False
        self.listener: NotifyListener | None = None
        self._closers: list[Callable[[], Awaitable[None]]] = []
        if self._dispatch_connections is not None:
            self._closers.append(self._dispatch_connections.close)

    async def start(self, *, seed: bool = True) -> None:
        await self._prepare(seed=seed)
        if self.listen and self.config.database.dialect == "postgresql":
            self.listener = NotifyListener(self.config.database.connection_url, self.signals)
            self._spawn(self.listener.run(self._stop), "notify-listener")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.listener.ready.wait(), timeout=10)
        if self.nats_advisories and self.config.nats.configured:
            link = advisory_link(self.config.nats, self.advisories, self._stop, "webhook-broker")
            self._spawn(link, "advisories")
        if self.run_sweeper:
            sweeper = Sweeper(
                self.sweeps,
                self.config.broker.rational_delay_seconds,
                vacuum_interval_seconds=self.config.pull.vacuum_interval_seconds,
                vacuum_min_dead_jobs=self.config.pull.vacuum_min_dead_jobs,
                observe_run=self.metrics.swept,
            )
            self._spawn(sweeper.run(self._stop), "sweeper")
            self._spawn(RedriveRunner(self.redrives).run(self._stop), "redrives")
        if self.run_dispatcher:
            self._start_dispatcher()

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

    def _start_dispatcher(self) -> None:
        broker = self.config.broker
        connection = self.config.consumer_connection
        poster = Poster(connection.connection_timeout_seconds, broker.max_workers, self.config.push)
        self._closers.append(poster.close)
        dispatcher = Dispatcher(
            self.push,
            self.signals,
            poster,
            max_workers=broker.max_workers,
            max_in_flight=self.config.push.max_in_flight,
            retry_after_max=self.config.push.retry_after_max_seconds,
            idle_seconds=broker.rational_delay_seconds,
            token_header=connection.token_header_name,
            user_agent=connection.user_agent,
            observe=self.metrics.pushed,
        )
        self._spawn(dispatcher.run(self._stop), "push-dispatcher")

    async def scrape(self) -> bytes:
        """The process's metrics; the database-read series at most every few seconds."""
        if self.metrics.stale():
            self.metrics.refreshed(
                await self.job_status.by_consumer(),
                await self.push.targets(),
                await self.job_status.ledger(),
            )
        return self.metrics.render()

    def _spawn(self, coro: object, name: str) -> None:
        assert asyncio.iscoroutine(coro)
        self._tasks.append(asyncio.create_task(coro, name=name))

    @property
    def draining(self) -> bool:
        """Stopping: `/_ready` fails, so a load balancer sends no new work here."""
        return self._draining or self._stop.is_set()

    def begin_draining(self) -> None:
        """A stop signal: readiness fails and waiting pulls are answered now, while the
        server finishes the requests in flight."""
        self._draining = True
        self.pulls.drain()

    async def stop(self) -> None:
        self._stop.set()
        await self.scheduler.close()
        if self._tasks:
            done, pending = await asyncio.wait(self._tasks, timeout=10)
            for task in pending:
                task.cancel()
            self._tasks.clear()
        for close in self._closers:
            await close()
        await self.db.dispose()
