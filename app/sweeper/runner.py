"""The sweeper loop around SweepService.sweep_all(), and the job table's vacuum."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from app.services.sweeping import SweepService

log = logging.getLogger(__name__)


class Sweeper:
    def __init__(
        self,
        sweeps: SweepService,
        interval_seconds: float,
        *,
        vacuum_interval_seconds: float = 0,
        vacuum_min_dead_jobs: int = 0,
    ) -> None:
        self._sweeps = sweeps
        self._interval = interval_seconds
        self._vacuum_interval = vacuum_interval_seconds
        self._vacuum_min_dead = vacuum_min_dead_jobs

    async def run(self, stop: asyncio.Event) -> None:
        vacuum = asyncio.create_task(self._vacuum_loop(stop)) if self._vacuum_interval else None
        try:
            while not stop.is_set():
                try:
                    moved = await self._sweeps.sweep_all()
                    if moved:
                        log.info("sweeper requeued or dead-lettered %d expired jobs", moved)
                except Exception:
                    log.exception("sweep failed; trying again next round")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._interval)
        finally:
            if vacuum is not None:
                vacuum.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await vacuum

    async def _vacuum_loop(self, stop: asyncio.Event) -> None:
        # Its own task: a vacuum of a big table takes seconds, sweeps must not wait for it.
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._vacuum_interval)
            if stop.is_set():
                return
            started = time.monotonic()
            try:
                if await self._sweeps.vacuum_if_needed(self._vacuum_min_dead):
                    log.info("vacuumed the job table in %.1f s", time.monotonic() - started)
            except Exception:
                log.exception("vacuum of the job table failed; trying again next round")
