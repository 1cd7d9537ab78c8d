"""PostgreSQL LISTEN loop: turns NOTIFYs from any process into local wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from app.store.db import CHANGES_CHANNEL, NOTIFY_CHANNEL, Waker, libpq_url

log = logging.getLogger(__name__)


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
            await self._read(conn, stop)

    async def _read(self, conn: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> None:
        """Notifications as the socket brings them, until `stop` or the connection fails.

        One reader callback for the connection's life, reading libpq's queue whenever the
        socket has data: psycopg's notifies() sets up a wait (a reader, an event and a
        timeout) for every batch, and every API process hears every publish's NOTIFY
        (docs/performance.md, "Why the hot paths look as they do"). Nothing else uses the
        connection meanwhile, so psycopg's own reads never race this one."""
        loop = asyncio.get_running_loop()
        pgconn = conn.pgconn
        encoding = conn.info.encoding
        lost: asyncio.Future[Any] = loop.create_future()

        def readable() -> None:
            try:
                pgconn.consume_input()
                while (notify := pgconn.notifies()) is not None:
                    try:
                        channel = notify.relname.decode(encoding)
                        payload = notify.extra.decode(encoding)
                        if channel == CHANGES_CHANNEL:
                            self.deliver_change(payload)
                        else:
                            self.deliver(payload)
                    except Exception:  # one bad notification must not stop the ones after it
                        log.exception("wake-up notification not delivered")
            except psycopg.Error as exc:  # the connection is gone: the run loop reconnects
                loop.remove_reader(fd)
                if not lost.done():
                    lost.set_exception(exc)

        fd = pgconn.socket
        loop.add_reader(fd, readable)
        stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        try:
            readable()  # what arrived with the LISTENs' answers
            await asyncio.wait({lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if lost.done():
                lost.result()
        finally:
            loop.remove_reader(fd)
            stopping.cancel()

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
