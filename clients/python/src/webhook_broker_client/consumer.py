"""A pull consumer, as its workers see it: fetch, next, consume, info, and the acks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from webhook_broker_client.acks import AckBatcher
from webhook_broker_client.consume import ConsumeContext, ConsumeOptions, ErrorCallback, Handler
from webhook_broker_client.errors import ConsumerGone, PinLost, ServerError
from webhook_broker_client.http import call
from webhook_broker_client.jobs import Job
from webhook_broker_client.pulls import stream_pull

# A fetch without heartbeats hears nothing until its first job or its end: it gives up this
# long after it should have ended.
FETCH_GRACE_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    pending: int  # due jobs, not yet handed out
    pending_bytes: int
    ack_pending: int  # handed out, not yet settled
    waiting: int  # pulls waiting in the broker process that answered
    redelivered: int
    last_delivered_at: datetime | None
    pin_id: str | None


def priority_terms(
    group: str | None,
    min_pending: int | None,
    min_ack_pending: int | None,
    priority: int | None,
) -> dict[str, Any]:
    """The priority group fields of a pull, as the broker (and JetStream) names them."""
    terms = {
        "group": group,
        "min_pending": min_pending,
        "min_ack_pending": min_ack_pending,
        "priority": priority,
    }
    return {key: value for key, value in terms.items() if value is not None}


class PullConsumer:
    def __init__(
        self,
        http: httpx.AsyncClient,
        channel: str,
        consumer: str,
        *,
        channel_token: str,
        consumer_token: str,
    ) -> None:
        self.http = http
        self.channel = channel
        self.consumer = consumer
        self.path = f"/channel/{quote(channel, safe='')}/consumer/{quote(consumer, safe='')}"
        self.headers = {
            "X-Broker-Channel-Token": channel_token,
            "X-Broker-Consumer-Token": consumer_token,
        }
        self.acks = AckBatcher(self._post_acks)
        self.pin_id: str | None = None  # pinned_client: the pin this client holds

    def __repr__(self) -> str:
        return f"PullConsumer({self.channel!r}, {self.consumer!r})"

    # -- acks (the jobs' AckSender) --------------------------------------------------------------

    async def send(self, item: dict[str, Any]) -> dict[str, Any]:
        return await self.acks.send(item)

    async def _post_acks(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        response = await call(
            self.http, "POST", f"{self.path}/ack", json={"acks": items}, headers=self.headers
        )
        results: list[dict[str, Any]] = response.json()["Results"]
        return results

    def job(self, body: dict[str, Any], pin_id: str | None = None) -> Job:
        return Job.from_wire(body, self, pin_id)

    # -- pulls -------------------------------------------------------------------------------------

    async def fetch(
        self,
        max_messages: int = 100,
        *,
        max_bytes: int | None = None,
        expires: float = 5.0,
        no_wait: bool = False,
        idle_heartbeat: float | None = None,
        group: str | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        priority: int | None = None,
    ) -> list[Job]:
        """One pull: up to `max_messages` jobs (and `max_bytes` of payload), received until the
        batch is filled or `expires` seconds have passed (`no_wait`: until nothing more is
        due). Empty when nothing came."""
        jobs: list[Job] = []
        body: dict[str, Any] = {
            "batch": max_messages,
            "expires": expires,
            "no_wait": no_wait,
            **priority_terms(group, min_pending, min_ack_pending, priority),
        }
        if max_bytes is not None:
            body["max_bytes"] = max_bytes
        if idle_heartbeat is not None:
            body["idle_heartbeat"] = idle_heartbeat
        if self.pin_id is not None:
            body["id"] = self.pin_id

        def received(job_body: dict[str, Any], pin: str | None) -> None:
            if pin is not None:
                self.pin_id = pin
            jobs.append(self.job(job_body, pin))

        silence = 2 * idle_heartbeat if idle_heartbeat else expires + FETCH_GRACE_SECONDS
        end = await stream_pull(
            self.http, f"{self.path}/pull", self.headers, body, received, silence=silence
        )
        if end.status == 410:
            raise ConsumerGone(410, end.reason)
        if end.status == 423:
            self.pin_id = None
            if not jobs:
                raise PinLost(423, end.reason)
        if end.status == 503 and not jobs:
            raise ServerError(503, end.reason)
        return jobs

    async def next(self, expires: float = 30.0, **terms: Any) -> Job | None:
        """One job, or None when none came within `expires` seconds."""
        jobs = await self.fetch(1, expires=expires, **terms)
        return jobs[0] if jobs else None

    def consume(
        self,
        handler: Handler | None = None,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        expires: float = 60.0,
        idle_heartbeat: float | None = None,
        threshold_messages: int | None = None,
        threshold_bytes: int | None = None,
        concurrency: int = 10,
        auto_ack: bool = True,
        error_callback: ErrorCallback | None = None,
        group: str | None = None,
        min_pending: int | None = None,
        min_ack_pending: int | None = None,
        priority: int | None = None,
        on_pinned: Any = None,
        on_unpinned: Any = None,
        stop_on_heartbeat_error: bool = True,
    ) -> ConsumeContext:
        """Keep up to `max_messages` jobs coming: each to `handler` (acked when it returns
        with `auto_ack`, naked when it raises), or, without one, to an `async for` over the
        returned context. See consume.py for how the buffer is kept."""
        options = ConsumeOptions(
            max_messages=max_messages,
            max_bytes=max_bytes,
            expires=expires,
            idle_heartbeat=idle_heartbeat,
            threshold_messages=threshold_messages,
            threshold_bytes=threshold_bytes,
            concurrency=concurrency,
            auto_ack=auto_ack,
            error_callback=error_callback,
            terms=priority_terms(group, min_pending, min_ack_pending, priority),
            on_pinned=on_pinned,
            on_unpinned=on_unpinned,
            stop_on_heartbeat_error=stop_on_heartbeat_error,
        )
        return ConsumeContext(self, handler, options)

    async def unpin(self, group: str) -> bool:
        """Clear the pin of a `pinned_client` consumer's `group`, so that its next job goes to
        a standby client; False when no client held it. This client keeps the pin it knew:
        its next pull naming it hears that it is gone (fetch raises PinLost when no job came;
        consume calls on_unpinned) and pulls afresh, the same path as an unpin by anyone else."""
        response = await call(
            self.http, "POST", f"{self.path}/unpin", json={"group": group}, headers=self.headers
        )
        return bool(response.json()["Unpinned"])

    async def info(self) -> ConsumerInfo:
        response = await call(self.http, "GET", f"{self.path}/info", headers=self.headers)
        body = response.json()
        last = body.get("LastDeliveredAt")
        return ConsumerInfo(
            pending=int(body["Pending"]),
            pending_bytes=int(body.get("PendingBytes", 0)),
            ack_pending=int(body["AckPending"]),
            waiting=int(body["Waiting"]),
            redelivered=int(body.get("Redelivered", 0)),
            last_delivered_at=datetime.fromisoformat(last) if last else None,
            pin_id=body.get("PinId"),
        )
