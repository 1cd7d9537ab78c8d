"""The bridge's copier of new consumers' history (deliver policies all, last,
by_start_sequence, by_start_time; app/services/backfill.py): every bridge copies the consumers
that are still copying, woken when this bridge creates one and every POLL_SECONDS otherwise,
so a consumer whose copy was cut short by a crash or a restart is finished by whichever bridge
runs next. Two bridges on one consumer take turns chunk by chunk (each chunk is conditional
on the cursor it read).

After its copies, each pass makes up the publishes that raced a switch to live (here, in
another bridge, or in the request that created the consumer) for every switch still recorded
in the database (BackfillService.make_up): the first pass right after a switch, then one every
POLL_SECONDS until the record is cleared, by this bridge or any other, also after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from app.logging import log_failure
from app.services.backfill import BackfillService
from app.services.consumer_management import Created

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0


class Backfiller:
    def __init__(self, service: BackfillService) -> None:
        self._service = service
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def created(self, created: Created) -> None:
        """A consumer made over NATS by this process (app/bridge/api.py)."""
        if created.switched is not None or created.consumer.options.backfilling:
            self.wake()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.copy_all(stop)
                await self.make_up_all()
            except Exception:
                log_failure(log, "copying consumers' history failed")
            waiting = asyncio.ensure_future(self._wake.wait())
            stopping = asyncio.ensure_future(stop.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(
                    (waiting, stopping), timeout=POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
            waiting.cancel()
            stopping.cancel()

    async def copy_all(self, stop: asyncio.Event) -> None:
        for consumer_pk, cursor in await self._service.copying():
            while not stop.is_set():
                step = await self._service.step(consumer_pk, cursor)
                if step.switched is not None:
                    log.info("consumer %d: history copied, live", consumer_pk)
                if step.live:
                    break
                cursor = step.cursor

    async def make_up_all(self) -> None:
        for consumer_pk, counted in await self._service.switches():
            if made := await self._service.make_up(consumer_pk, counted):
                log.info(
                    "consumer %d: %d jobs made for publishes that raced its switch to live",
                    consumer_pk,
                    made,
                )
