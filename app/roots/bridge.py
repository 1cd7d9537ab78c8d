"""The `bridge` process: JetStream pull clients take jobs over NATS ([nats])."""

from __future__ import annotations

import asyncio

from app.bridge.bridge import Bridge
from app.config import Config

from .pulling import PullingProcess


class BridgeRoot(PullingProcess):
    def __init__(self, config: Config) -> None:
        # Advisories go out on the bridge's own NATS connection (Bridge.start attaches it).
        super().__init__(config, listen=True, nats_advisories=False)

    async def serve(self, stop: asyncio.Event) -> None:
        """The bridge until `stop` is set; waiting pulls end, received acks are applied."""
        await Bridge(self, self.config.nats).run(stop)
