"""The parts of a process that hands out jobs to waiting pulls (the API and the NATS bridge)."""

from __future__ import annotations

from app.config import Config
from app.services.acking import AckService
from app.services.bridge import BridgeService
from app.services.claiming import ClaimSource
from app.services.pinning import PinService
from app.services.scheduler import PullScheduler
from app.store.queue import Queue

from .process import Process


class PullingProcess(Process):
    """A process with waiting pulls: one scheduler for all of them, their claims and acks."""

    queue: Queue
    pins: PinService
    claims: ClaimSource
    scheduler: PullScheduler
    acks: AckService

    def __init__(self, config: Config, *, listen: bool, nats_advisories: bool) -> None:
        super().__init__(config, listen=listen, nats_advisories=nats_advisories)
        ack_wait = config.default_ack_wait_seconds
        self.queue = Queue(self.db, self.metrics.transition, self.metrics.statement)
        self.pins = PinService(self.db, self.advisories)
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
        self.acks = AckService(
            self.db,
            self.queue,
            config.broker.retry_policy,
            ack_wait,
            config.pull.max_batch,
            self.metrics.transition,
        )
        self.metrics.watch_waiting(self.scheduler.waiting_total)

    def bridge_service(self) -> BridgeService:
        """The NATS bridge's use cases over this process's claims, acks and pins (a bridge
        started in a process shares its scheduler)."""
        return BridgeService(
            self.db, self.claims, self.acks, self.config.broker.retry_policy, self.pins
        )

    async def _close(self) -> None:
        await self.scheduler.close()
