"""The sweeper loop around SweepService.sweep_all()."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.services.sweeping import SweepService

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(self, sweeps: SweepService, interval_seconds: float) -> None:
        self._sweeps = sweeps
        self._interval = interval_seconds

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                moved = await self._sweeps.sweep_all()
                if moved:
                    log.info("sweeper requeued or dead-lettered %d expired jobs", moved)
            except Exception:
                log.exception("sweep failed; trying again next round")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval)
