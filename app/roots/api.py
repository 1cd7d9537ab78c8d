"""The `api` process: the HTTP API's services."""

from __future__ import annotations

from app.config import Config
from app.domain.callbacks import CallbackPolicy
from app.domain.pulls import PullLimits
from app.services.admin import AdminService
from app.services.console import ConsoleService
from app.services.health import HealthService
from app.services.messages import MessageQueries
from app.services.pausing import PauseService
from app.services.publishing import PublishingService
from app.services.pulling import PullService
from app.services.redrives import RedriveService
from app.services.seed_jobs import SeedJobService
from app.store.migrate import head_revisions

from .pulling import PullingProcess


class ApiRoot(PullingProcess):
    """What the routes use (app/api/deps.ApiServices); started by create_app's lifespan in a
    process of its own, by the caller in tests."""

    admin: AdminService
    publishing: PublishingService
    messages: MessageQueries
    health: HealthService
    redrives: RedriveService
    pulls: PullService
    seed_jobs: SeedJobService
    console: ConsoleService
    pauses: PauseService

    def __init__(
        self, config: Config, *, listen: bool = True, nats_advisories: bool = False
    ) -> None:
        super().__init__(config, listen=listen, nats_advisories=nats_advisories)
        ack_wait = config.default_ack_wait_seconds
        self.admin = AdminService(
            self.db,
            self.tokens,
            config.push.signing_secret_overlap_seconds,
            callbacks=CallbackPolicy.of(
                config.push.deny_callback_networks,
                deny_private=config.push.deny_private_callbacks,
                allow=config.push.allow_callback_networks,
            ),
            reads=self.reads,
        )
        self.publishing = PublishingService(
            self.db,
            self.queue,
            config.broker.max_message_size_bytes,
            min_schedule_delay=config.min_schedule_delay_minutes * 60,
            token_header=config.consumer_connection.token_header_name,
        )
        self.messages = MessageQueries(self.db, self.reads)
        self.health = HealthService(self.db, head_revisions(config.database))
        self.redrives = RedriveService(self.db, self.metrics.transition)
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
        self.seed_jobs = SeedJobService(self.db, self.queue, ack_wait, self.reads)
        self.console = ConsoleService(self.db, self.reads)
        self.pauses = PauseService(self.db)
        self._draining = False

    @property
    def draining(self) -> bool:
        """Stopping: `/_ready` fails, so a load balancer sends no new work here."""
        return self._draining or self._stop.is_set()

    def begin_draining(self) -> None:
        """A stop signal: readiness fails and waiting pulls are answered now, while the
        server finishes the requests in flight."""
        self._draining = True
        self.pulls.drain()
