"""The bridge's copier of new consumers' history (deliver policies all, last,
by_start_sequence, by_start_time; app/services/backfill.py): every bridge copies the consumers
that are still copying, woken when this bridge creates one and every POLL_SECONDS otherwise,
so a consumer whose copy was cut short by a crash or a restart is finished by whichever bridge
runs next. Two bridges on one consumer take turns chunk by chunk (each chunk is conditional
on the cursor it read).

After a switch to live (here or in the request that created the consumer) it looks MAKE_UP
seconds later for publishes that raced the switch and gives the consumer their jobs
(BackfillService.make_up). A bridge that stops in between leaves those few messages without
a job for the consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.logging import log_failure
from app.services.backfill import BackfillService, Switched
from app.services.consumer_management import Created

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
# When to look for publishes that raced a switch: they commit as soon as it does, unless the
# database is slow; the later looks find the stragglers.
MAKE_UP = (0.5, 2.0, 10.0)


class Backfiller:
    def __init__(self, service: BackfillService) -> None:
        self._service = service
        self._wake = asyncio.Event()
        # (when, looks done, switch) of consumers whose racing publishes are still looked for.
        self._switched: list[tuple[float, int, Switched]] = []

    def wake(self) -> None:
        self._wake.set()

    def created(self, created: Created) -> None:
        """A consumer made over NATS by this process (app/bridge/api.py)."""
        if created.switched is not None:
            self.switched(created.switched)
        elif created.consumer.options.backfilling:
            self.wake()

    def switched(self, switch: Switched) -> None:
        """A consumer went live (in this process): look for publishes that raced it."""
        self._switched.append((self._now() + MAKE_UP[0], 0, switch))
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.copy_all(stop)
                await self.make_up()
            except Exception:
                log_failure(log, "copying consumers' history failed")
            timeout = POLL_SECONDS
            if self._switched:
                timeout = max(min(min(s[0] for s in self._switched) - self._now(), timeout), 0)
            waiting = asyncio.ensure_future(self._wake.wait())
            stopping = asyncio.ensure_future(stop.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(
                    (waiting, stopping), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            waiting.cancel()
            stopping.cancel()

    async def copy_all(self, stop: asyncio.Event) -> None:
        for consumer_pk, cursor in await self._service.copying():
            while not stop.is_set():
                step = await self._service.step(consumer_pk, cursor)
                if step.switched is not None:
                    log.info("consumer %d: history copied, live", consumer_pk)
                    self.switched(step.switched)
                if step.live:
                    break
                cursor = step.cursor

    async def make_up(self) -> None:
        now = self._now()
        due = [entry for entry in self._switched if entry[0] <= now]
        self._switched = [entry for entry in self._switched if entry[0] > now]
        for _, looks, switch in due:
            try:
                after = await self._service.make_up(switch)
            except Exception:
                self._switched.append((now + POLL_SECONDS, looks, switch))
                raise
            if after.counted != switch.counted:
                log.info(
                    "consumer %d: %d jobs made for publishes that raced its switch to live",
                    switch.consumer_pk,
                    after.counted - switch.counted,
                )
            if looks + 1 < len(MAKE_UP):
                self._switched.append((now + MAKE_UP[looks + 1], looks + 1, after))

    def _now(self) -> float:
        return asyncio.get_running_loop().time()
