"""One streaming pull: the broker writes the jobs as it claims them, idle heartbeats, and one
status line saying how the request ended (docs/guides/streaming-pulls.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from webhook_broker_client.errors import HeartbeatError, ServerError
from webhook_broker_client.http import raise_for


@dataclass(frozen=True, slots=True)
class PullEnd:
    status: int  # 200 filled, 404 no messages, 408 expired, 409 max_bytes, 410, 423, 503
    reason: str
    pending_messages: int  # what the request asked for and did not get
    pending_bytes: int


# The stream's own silence watch (or its expiry) bounds it, not httpx's read timeout.
UNTIMED = httpx.Timeout(10.0, read=None, pool=None)

OnJob = Callable[[dict[str, Any], str | None], None]


async def stream_pull(
    http: httpx.AsyncClient,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any],
    on_job: OnJob,
    *,
    silence: float | None,
    on_heartbeat: Callable[[], None] | None = None,
) -> PullEnd:
    """Run one streaming pull to its end, handing each job line to `on_job` (its job object and
    its pin id) and telling `on_heartbeat` of each heartbeat line. `silence`: the longest wait
    for any line (the response's headers included) before the pull is given up with a
    HeartbeatError; None waits as long as the request may last."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None if silence is None else loop.time() + silence) as quiet:
            async with http.stream(
                "POST", path, json={**body, "stream": True}, headers=headers, timeout=UNTIMED
            ) as response:
                if response.status_code >= 400:
                    raise_for(response, await response.aread())
                async for line in response.aiter_lines():
                    if silence is not None:
                        quiet.reschedule(loop.time() + silence)
                    if not line:
                        continue
                    event = orjson.loads(line)
                    if "Job" in event:
                        on_job(event["Job"], event.get("PinId"))
                    elif "Heartbeat" in event:
                        if on_heartbeat is not None:
                            on_heartbeat()
                    elif "Status" in event:
                        return PullEnd(
                            int(event["Status"]),
                            str(event.get("Reason", "")),
                            int(event.get("PendingMessages", 0)),
                            int(event.get("PendingBytes", 0)),
                        )
    except TimeoutError:
        raise HeartbeatError(f"nothing heard from the broker for {silence} seconds") from None
    except httpx.TransportError as exc:
        raise ServerError(0, f"{type(exc).__name__}: {exc}") from exc
    raise ServerError(0, "the stream ended without its status line")
