"""PostgreSQL LISTEN loop: turns NOTIFYs from any process into local wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg

from app.store.db import CHANGES_CHANNEL, NOTIFY_CHANNEL, Waker, libpq_url

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.5


class NotifyListener:
    """Holds one autocommit connection LISTENing on the jobs and consumer-changes channels;
    reconnects on failure."""

    def __init__(self, connection_url: str, signals: Waker) -> None:
        self._url = libpq_url(connection_url)
        self._signals = signals
        self.ready = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        delay = 0.1
        while not stop.is_set():
            try:
                await self._listen(stop)
                delay = 0.1
            except (OSError, psycopg.Error) as exc:
                log.warning("notify listener lost its connection (%s); reconnecting", exc)
                self.ready.clear()
                self._missed()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                delay = min(delay * 2, 5.0)

    async def _listen(self, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(self._url, autocommit=True) as conn:
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            await conn.execute(f"LISTEN {CHANGES_CHANNEL}")
            self.ready.set()
            # Wake everyone once: anything published (or changed) before LISTEN took effect is
            # now visible.
            self._missed()
            while not stop.is_set():
                # A bounded wait instead of cancelling the read: cancelling it mid-wait can
                # leave the connection locked, so shutdown would stall on close.
                async for notify in conn.notifies(timeout=STOP_CHECK_SECONDS):
                    if notify.channel == CHANGES_CHANNEL:
                        self.deliver_change(notify.payload)
                    else:
                        self.deliver(notify.payload)

    def _missed(self) -> None:
        """Notifications may have been missed: every consumer as read is stale, every waiter
        looks again."""
        self._signals.changed([])
        self._signals.wake_all()

    def deliver(self, payload: str) -> None:
        """Wake the consumers a NOTIFY names: "12,40", or "*" for everyone.

        Anything else on the channel (a hand-typed NOTIFY, say) is logged and skipped: it must
        not end the loop, or this process would stop hearing about jobs.
        """
        if payload.strip() == "*":
            self._signals.wake_all()
            return
        self._signals.wake(_pks(payload, NOTIFY_CHANNEL))

    def deliver_change(self, payload: str) -> None:
        """Consumers whose settings changed: "12,40", or "*" (too many to name). Whatever it
        names, what this process read of consumers is stale."""
        pks = [] if payload.strip() == "*" else _pks(payload, CHANGES_CHANNEL)
        self._signals.changed(pks)


def _pks(payload: str, channel: str) -> list[int]:
    pks = []
    for part in payload.split(","):
        try:
            pks.append(int(part))
        except ValueError:
            if part.strip():
                log.warning("ignoring malformed wake-up %r on %s", part, channel)
    return pks
