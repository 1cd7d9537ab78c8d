"""The sweeper loop around SweepService.sweep_all(), and the job table's vacuum."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

from app.logging import log_failure
from app.services.sweeping import SweepService

log = logging.getLogger(__name__)

# A sweep runs just after the earliest lease ends (the margin covers the strict `<` of the
# sweep and clock rounding). A lease already over that this round did not move (a sweeper next
# door holds it) is looked at again after MIN_PAUSE, not at once, so that no sweeper spins.
LEASE_END_MARGIN = 0.005
MIN_PAUSE = 0.01
INACTIVE_RECHECK = 0.25
# A vacuum of V seconds (it reads every index of the job table whole, so V grows with the
# table) buys back what claims lose walking the dead entries that pile up until it runs, which
# grows with the square of the wait: one every T seconds costs V / T + a T / 2 a second, least
# at T = sqrt(2 V / a). The harness measured a = 0.03 (26,000 jobs/s): T = 8 sqrt(V), every
# 2.8 s for the bench's table (V = 0.12 s), every 14 s for one whose vacuum takes 3 s
# (docs/performance.md, "Why the hot paths look as they do"; the runs: bench/journal/README.md).
# Per sweeper process: two vacuum up to twice as often.
VACUUM_SPACING = 8.0  # seconds per square root of a second


def next_vacuum_at(started: float, ended: float) -> float:
    """The earliest moment (monotonic) the vacuum after one that ran from `started` to `ended`
    may begin."""
    return max(ended, started + VACUUM_SPACING * math.sqrt(max(0.0, ended - started)))


class Sweeper:
    def __init__(
        self,
        sweeps: SweepService,
        interval_seconds: float,
        *,
        vacuum_interval_seconds: float = 0,
        vacuum_min_dead_jobs: int = 0,
        observe_run: Callable[[float], None] = lambda _seconds: None,
    ) -> None:
        self._observe_run = observe_run
        self._sweeps = sweeps
        self._interval = interval_seconds
        self._vacuum_interval = vacuum_interval_seconds
        self._vacuum_min_dead = vacuum_min_dead_jobs

    async def run(self, stop: asyncio.Event) -> None:
        vacuum = asyncio.create_task(self._vacuum_loop(stop)) if self._vacuum_interval else None
        try:
            while not stop.is_set():
                try:
                    started = time.monotonic()
                    moved = await self._sweeps.sweep_all()
                    self._observe_run(time.monotonic() - started)
                    if moved:
                        log.info("sweeper requeued or dead-lettered %d expired jobs", moved)
                    for consumer_pk, group in await self._sweeps.expire_pins():
                        log.info("pin of group %s of consumer %s lapsed", group, consumer_pk)
                    for channel_id, consumer_id in await self._sweeps.expire_inactive():
                        log.info(
                            "consumer %s of channel %s deleted: inactive past its threshold",
                            consumer_id,
                            channel_id,
                        )
                    pause = await self._pause()
                except Exception:
                    log_failure(log, "sweep failed; trying again next round")
                    pause = self._interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=pause)
        finally:
            if vacuum is not None:
                vacuum.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await vacuum

    async def _pause(self) -> float:
        """Until the earliest running lease ends, so that a lapsed job is offered again as its
        lease ends rather than up to an interval later; and never longer than the shortest
        lease a claim could start meanwhile, so that the round after a new lease still comes
        before that lease ends."""
        horizon = await self._sweeps.lease_horizon()
        pause = self._interval
        if horizon.shortest_ack_wait is not None:
            pause = min(pause, horizon.shortest_ack_wait)
        if horizon.next_end is not None:
            until = (horizon.next_end - datetime.now(UTC)).total_seconds()
            pause = min(pause, until + LEASE_END_MARGIN if until > 0 else MIN_PAUSE)
        if horizon.next_inactive is not None:
            # A consumer past its threshold but kept (a delivery's ack wait still running) is
            # looked at again after INACTIVE_RECHECK, not at once.
            until = (horizon.next_inactive - datetime.now(UTC)).total_seconds()
            pause = min(pause, max(until + LEASE_END_MARGIN, INACTIVE_RECHECK))
        return pause

    async def _vacuum_loop(self, stop: asyncio.Event) -> None:
        # Its own task: a vacuum of a big table takes seconds, sweeps must not wait for it.
        not_before = 0.0
        while not stop.is_set():
            pause = max(self._vacuum_interval, not_before - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=pause)
            if stop.is_set():
                return
            started = time.monotonic()
            try:
                vacuumed = await self._sweeps.vacuum_if_needed(self._vacuum_min_dead)
            except Exception:
                # It may have run long before failing: spaced as one that ran.
                not_before = next_vacuum_at(started, time.monotonic())
                log_failure(log, "vacuum of the job table failed; trying again later")
                continue
            if vacuumed:
                ended = time.monotonic()
                not_before = next_vacuum_at(started, ended)
                # Debug: every few seconds under load (and instantly, if another vacuum held the
                # table: SKIP_LOCKED).
                log.debug("vacuumed the job table in %.1f ms", 1000 * (ended - started))
