"""Where the services' JetStream advisories go: nowhere until the process attaches a NATS
publisher (the bridge its connection; an API process or a sweeper one of its own when
`[nats]` is configured). Advisories are best effort, as on nats-server: one that cannot be
published is dropped, never a reason for a request or a sweep to fail."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from app.domain.advisories import Advisory

log = logging.getLogger(__name__)

Publish = Callable[[Advisory], Awaitable[None]]


class Advisories:
    def __init__(self) -> None:
        self._publish: Publish | None = None

    def attach(self, publish: Publish | None) -> None:
        self._publish = publish

    @property
    def attached(self) -> bool:
        return self._publish is not None

    async def emit(self, advisory: Advisory) -> None:
        if self._publish is None:
            return
        try:
            await self._publish(advisory)
        except Exception as exc:
            log.debug("advisory %s not published: %s", advisory.subject, exc)
