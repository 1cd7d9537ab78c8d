"""Acks from many workers, coalesced into batch-ack requests.

An ack waits only while the batch-ack requests already on their way fill the pipe: when one is
free it goes at once with everything that queued up behind it (up to `max_items`). A lone ack
costs one round trip; a hundred workers acking at once cost a few. Each caller still gets its
own outcome: the result item the broker answered for it, or the error it stands for.

`max_items` starts at the broker's default `[pull] max-batch`; a broker configured lower refuses
a longer batch whole (400, "at most N acks per request", before it applies any), and the
batcher then sends that batch again in parts of N and keeps to N from there on.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

from webhook_broker_client.errors import (
    BrokerError,
    InvalidRequest,
    JobNotFound,
    ServerError,
    StaleAck,
)

Post = Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]

# The broker's batch ack takes up to [pull] max-batch items, 256 by default. Fewer per request
# cost more: consume() with 100 ran 12-15% slower than with 256 (bench/journal/README.md,
# 2026-11-28).
MAX_ITEMS = 256
MAX_IN_FLIGHT = 4
# How long a batch is tried again while the broker cannot be reached (a restart, say).
RETRY_FOR_SECONDS = 15.0
# The broker's refusal of a batch longer than its [pull] max-batch (app/services/acking.py).
_TOO_MANY = re.compile(r"at most (\d+) acks per request")


class AckBatcher:
    def __init__(
        self,
        post: Post,
        *,
        max_items: int = MAX_ITEMS,
        max_in_flight: int = MAX_IN_FLIGHT,
        retry_for: float = RETRY_FOR_SECONDS,
    ) -> None:
        self._post = post
        self._max_items = max_items
        self._max_in_flight = max_in_flight
        self._retry_for = retry_for
        self._waiting: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0  # batch-ack requests sent (tries included)

    async def send(self, item: dict[str, Any]) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._schedule()
        return await future

    async def close(self) -> None:
        """Wait for what is queued or on its way."""
        while self._waiting or self._tasks:
            if self._tasks:
                await asyncio.wait(set(self._tasks))
            else:
                await asyncio.sleep(0)

    def _schedule(self) -> None:
        # On the next turn of the loop: the acks of every worker woken in this one join.
        if not self._scheduled and self._waiting and self._in_flight < self._max_in_flight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._waiting and self._in_flight < self._max_in_flight:
            batch, self._waiting = (
                self._waiting[: self._max_items],
                self._waiting[self._max_items :],
            )
            self._in_flight += 1
            task = asyncio.create_task(self._deliver(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _deliver(
        self, batch: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]]
    ) -> None:
        try:
            results = await self._post_within_limit([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(
                        exc if isinstance(exc, Exception) else ServerError(0, repr(exc))
                    )
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    _settle(future, result)
        finally:
            self._in_flight -= 1
            self._schedule()

    async def _post_within_limit(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        try:
            return await self._post_with_retries(items)
        except InvalidRequest as exc:
            limit = _limit_in(exc)
            if limit is None or len(items) <= limit:
                raise
        # Refused whole, nothing applied: the same items again, in parts the broker takes.
        self._max_items = limit
        results: list[dict[str, Any]] = []
        for start in range(0, len(items), limit):
            results += await self._post_with_retries(items[start : start + limit])
        return results

    async def _post_with_retries(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_for
        delay = 0.1
        while True:
            self.requests += 1
            try:
                return await self._post(items)
            except ServerError:
                if loop.time() + delay > deadline:
                    raise
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)


def _limit_in(error: InvalidRequest) -> int | None:
    """The broker's [pull] max-batch, from its refusal of a batch longer than that."""
    found = _TOO_MANY.search(error.detail)
    limit = int(found.group(1)) if found else 0
    return limit if limit >= 1 else None


def _settle(future: asyncio.Future[dict[str, Any]], result: dict[str, Any]) -> None:
    status = result.get("status")
    detail = str(result.get("detail") or "")
    if status in (200, 202):
        future.set_result(result)
    elif status == 404:
        future.set_exception(JobNotFound(404, detail or "no such job"))
    elif status == 409:
        future.set_exception(StaleAck(409, detail or "not in flight under this attempt"))
    elif status == 400:
        future.set_exception(InvalidRequest(400, detail))
    else:
        future.set_exception(BrokerError(int(status or 0), detail))
