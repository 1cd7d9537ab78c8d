"""Publishing the services' JetStream advisories on NATS: through the bridge's connection,
or, in an API process or a sweeper, through a connection of its own (`advisory_link`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.nuid import NUID

from app.bridge import protocol as p
from app.bridge.client import client_options
from app.config import NatsConfig
from app.domain.advisories import Advisory
from app.services.advisories import Advisories

log = logging.getLogger(__name__)

# A process whose NATS server is not there yet tries again this often.
RETRY_SECONDS = 2.0


class AdvisoryPublisher:
    """Writes an advisory as nats-server does (type, id, timestamp, then its fields)."""

    def __init__(self, publish: Callable[[str, bytes], Awaitable[None]]) -> None:
        self._publish = publish
        self._nuid = NUID()

    async def __call__(self, advisory: Advisory) -> None:
        body = p.advisory(
            advisory.type, self._nuid.next().decode(), datetime.now(UTC), advisory.fields
        )
        await self._publish(advisory.subject, body)


async def advisory_link(
    config: NatsConfig, advisories: Advisories, stop: asyncio.Event, name: str
) -> None:
    """Connect (retrying until the server is there), attach, and close at `stop`."""
    nc = Client()
    while not stop.is_set():
        try:
            await nc.connect(**client_options(config, name))
            break
        except Exception as exc:
            log.warning("advisories: NATS not reachable (%s); trying again", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=RETRY_SECONDS)
    if stop.is_set():
        return

    async def publish(subject: str, body: bytes) -> None:
        if nc.is_connected:
            await nc.publish(subject, body)

    advisories.attach(AdvisoryPublisher(publish))
    try:
        await stop.wait()
    finally:
        advisories.attach(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), timeout=5)
