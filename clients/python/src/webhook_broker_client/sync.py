"""A synchronous face of the client for scripts: the async client runs on an event loop in a
thread of its own, and each call waits for its result.

    with SyncBroker("http://localhost:8080", producer_id="shop", producer_token="...",
                    channel_tokens={"orders": "..."}) as broker:
        broker.publish("orders", {"order": 1001})
        billing = broker.consumer("orders", "billing", consumer_token="...")
        for job in billing.fetch(10, expires=2):
            print(job.json())
            job.ack()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

from webhook_broker_client.broker import Broker, Payload, Published
from webhook_broker_client.consumer import ConsumerInfo, PullConsumer
from webhook_broker_client.errors import BrokerError
from webhook_broker_client.jobs import Job

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncJob:
    """A Job whose acks wait for their outcome."""

    def __init__(self, job: Job, runner: _LoopThread) -> None:
        self.job = job
        self._run = runner.run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.job, name)

    def __repr__(self) -> str:
        return f"Sync{self.job!r}"

    def ack(self) -> None:
        self._run(self.job.ack())

    def nak(self, delay: float | None = None) -> None:
        self._run(self.job.nak(delay))

    def term(self, reason: str | None = None) -> None:
        self._run(self.job.term(reason))

    def hand_back(self) -> None:
        self._run(self.job.hand_back())

    def in_progress(self) -> datetime:
        return self._run(self.job.in_progress())


class SyncPullConsumer:
    def __init__(self, consumer: PullConsumer, runner: _LoopThread) -> None:
        self.consumer = consumer
        self._runner = runner

    def fetch(self, max_messages: int = 100, **options: Any) -> list[SyncJob]:
        jobs = self._runner.run(self.consumer.fetch(max_messages, **options))
        return [SyncJob(job, self._runner) for job in jobs]

    def next(self, expires: float = 30.0, **terms: Any) -> SyncJob | None:
        job = self._runner.run(self.consumer.next(expires, **terms))
        return None if job is None else SyncJob(job, self._runner)

    def unpin(self, group: str) -> bool:
        return self._runner.run(self.consumer.unpin(group))

    def info(self) -> ConsumerInfo:
        return self._runner.run(self.consumer.info())


class SyncBroker:
    def __init__(self, base_url: str, **options: Any) -> None:
        self._runner = _LoopThread()

        async def build() -> Broker:
            return Broker(base_url, **options)

        self.broker = self._runner.run(build())

    def __enter__(self) -> SyncBroker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._runner.run(self.broker.aclose())
        self._runner.close()

    def publish(self, channel: str, payload: Payload, **options: Any) -> Published:
        return self._runner.run(self.broker.publish(channel, payload, **options))

    def publish_many(
        self, channel: str, payloads: Iterable[Payload], **options: Any
    ) -> list[Published | BrokerError]:
        return self._runner.run(self.broker.publish_many(channel, payloads, **options))

    def put_channel(self, channel: str, **fields: Any) -> dict[str, Any]:
        return self._runner.run(self.broker.put_channel(channel, **fields))

    def put_producer(self, producer: str, **fields: Any) -> dict[str, Any]:
        return self._runner.run(self.broker.put_producer(producer, **fields))

    def put_consumer(self, channel: str, consumer: str, **fields: Any) -> dict[str, Any]:
        return self._runner.run(self.broker.put_consumer(channel, consumer, **fields))

    def delete_consumer(self, channel: str, consumer: str) -> None:
        self._runner.run(self.broker.delete_consumer(channel, consumer))

    def consumer(self, channel: str, consumer: str, **tokens: str) -> SyncPullConsumer:
        return SyncPullConsumer(self.broker.consumer(channel, consumer, **tokens), self._runner)
