"""The `dispatcher` process: push delivery to callback URLs."""

from __future__ import annotations

from app.config import Config
from app.dispatch.dispatcher import Dispatcher
from app.dispatch.http import Poster
from app.services.push import BreakerSettings, PushService
from app.store.queue import Queue

from .process import Process


def push_service(process: Process) -> PushService:
    """The push use cases, their claims and acks on connections of their own (store/db.Held),
    two: the claiming loop and the recorder of answers each run a statement at a time. They
    open on first use and close with the process."""
    config = process.config
    held = process.db.held(2)
    if held is not None:
        process.close_with(held.close)
    queue = Queue(process.db, process.metrics.transition, process.metrics.statement, held=held)
    return PushService(
        process.db,
        queue,
        config.broker.retry_policy,
        config.default_ack_wait_seconds,
        BreakerSettings(config.push.breaker_failures, config.push.breaker_cooldown_seconds),
    )


def start_dispatching(process: Process, push: PushService) -> None:
    """The push dispatcher's loop, until the process stops."""
    config = process.config
    broker = config.broker
    connection = config.consumer_connection
    poster = Poster(connection.connection_timeout_seconds, broker.max_workers, config.push)
    process.close_with(poster.close)
    dispatcher = Dispatcher(
        push,
        process.signals,
        poster,
        max_workers=broker.max_workers,
        max_in_flight=config.push.max_in_flight,
        retry_after_max=config.push.retry_after_max_seconds,
        idle_seconds=broker.rational_delay_seconds,
        token_header=connection.token_header_name,
        user_agent=connection.user_agent,
        observe=process.metrics.pushed,
        observe_round=process.metrics.push_rounds.inc,
    )
    process.spawn(dispatcher.run, "push-dispatcher")


class DispatcherRoot(Process):
    push: PushService

    def __init__(self, config: Config) -> None:
        super().__init__(config, listen=True, nats_advisories=False)
        self.push = push_service(self)

    def _run(self) -> None:
        start_dispatching(self, self.push)
