"""The sweeper's partition round (PostgreSQL): the job table's partitions made ahead, rotated,
drained and, once archived, dropped (app/services/retention.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.logging import log_failure
from app.services.retention import RetentionService

log = logging.getLogger(__name__)

# A round a minute at most: a rotation then comes at most this late, and draining a partition
# whose time came goes at a chunk a statement meanwhile. Short intervals (tests) go faster.
MAX_PERIOD = 60.0
MIN_PERIOD = 0.2


def period_for(interval_seconds: float) -> float:
    if interval_seconds <= 0:
        return MAX_PERIOD
    return max(MIN_PERIOD, min(MAX_PERIOD, interval_seconds / 10))


class PartitionRunner:
    def __init__(self, retention: RetentionService, period: float) -> None:
        self._retention = retention
        self._period = period

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                report = await self._retention.run_round()
                if report.moved:
                    log.info("moved %d unfinished jobs out of closing partitions", report.moved)
            except Exception:
                log_failure(log, "job partition round failed; trying again next round")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._period)
