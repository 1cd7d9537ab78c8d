"""The loop that moves running redrives on, beside the sweeper (the same processes run it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.logging import log_failure
from app.services.redrives import IDLE_LOOK, RedriveService

log = logging.getLogger(__name__)


class RedriveRunner:
    def __init__(self, redrives: RedriveService) -> None:
        self._redrives = redrives

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                pause = await self._redrives.step()
            except Exception:
                log_failure(log, "redrive step failed; trying again shortly")
                pause = IDLE_LOOK
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=pause)
