"""The overview's live updates: one publisher task per API process reads the overview once per
update and hands the same rendered table to every open page.

It wakes on the broker's own change announcements (Signals: NOTIFY on PostgreSQL, the commit
hook on SQLite) and at least every HEARTBEAT seconds (claims and acks announce nothing, and the
ages move on), never more often than every MIN_INTERVAL seconds however many changes arrive
(the debounce). It runs only while a page is open. Each sample also feeds the short in-memory
history the small charts draw (delivery rate from the DELIVERED counter's growth, and depth).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from app.services.console import ConsoleService, Overview
from app.services.signals import ANY_CONSUMER, Signals

log = logging.getLogger(__name__)

MIN_INTERVAL = 1.0
HEARTBEAT = 5.0
HISTORY = 120  # samples kept per consumer (10 minutes at the heartbeat)

Key = tuple[str, str]


class LiveFull(Exception):
    """As many pages are open as the process serves."""


@dataclass
class Series:
    """A consumer's recent samples: time (unix seconds), deliveries a second, depth."""

    t: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    rate: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    depth: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    last_delivered: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    overview: Overview
    history: dict[Key, Series]
    taken: float


class LiveOverview:
    def __init__(
        self,
        console: ConsoleService,
        signals: Signals,
        render: Callable[[Snapshot, bool], str],
        *,
        max_pages: int,
    ) -> None:
        self._console = console
        self._signals = signals
        self._render = render
        self.max_pages = max_pages
        # Each open page's queue, and whether it may act (the table's action links).
        self._subscribers: dict[asyncio.Queue[str], bool] = {}
        self._history: dict[Key, Series] = {}
        self._latest: Snapshot | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.reads = 0  # overview reads made: the tests count them against the pages open

    async def snapshot(self, *, fresh: bool = False) -> Snapshot:
        """The newest overview, read again only when older than MIN_INTERVAL (a page load
        between updates costs no query), or when `fresh` (the publisher's own reads: it has
        waited MIN_INTERVAL already, and a sleep can end a fraction of a millisecond short of
        it by the clock, which would send the pages the table they have once more)."""
        async with self._lock:
            latest = self._latest
            if not fresh and latest is not None and time.monotonic() - latest.taken < MIN_INTERVAL:
                return latest
            overview = await self._console.overview()
            self.reads += 1
            self._sample(overview)
            self._latest = Snapshot(overview, self._history, time.monotonic())
            return self._latest

    def _sample(self, overview: Overview) -> None:
        now = overview.at.timestamp()
        seen: set[Key] = set()
        for row in overview.consumers:
            key = (row.channel_id, row.consumer_id)
            seen.add(key)
            series = self._history.setdefault(key, Series())
            rate = 0.0
            if series.last_delivered is not None and series.t:
                elapsed = now - series.t[-1]
                # A redrive of DELIVERED jobs lowers the counter: no negative rates.
                grown = max(0, row.delivered - series.last_delivered)
                rate = grown / elapsed if elapsed > 0 else 0.0
            series.last_delivered = row.delivered
            series.t.append(now)
            series.rate.append(round(rate, 2))
            series.depth.append(row.queued)
        for gone in set(self._history) - seen:
            del self._history[gone]

    @property
    def full(self) -> bool:
        return len(self._subscribers) >= self.max_pages

    @contextlib.asynccontextmanager
    async def subscribe(self, can_act: bool) -> AsyncIterator[asyncio.Queue[str]]:
        """A queue that receives each rendered update (only the newest is kept for a slow
        reader); LiveFull when max_pages are open already."""
        if self.full:
            raise LiveFull
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers[queue] = can_act
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._publish(), name="console-live")
        try:
            yield queue
        finally:
            self._subscribers.pop(queue, None)

    async def _publish(self) -> None:
        with self._signals.subscribe(ANY_CONSUMER) as changed:
            while self._subscribers:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), HEARTBEAT)
                changed.clear()
                try:
                    snapshot = await self.snapshot(fresh=True)
                except Exception:  # the database may be away; the pages keep the last table
                    log.exception("the console's overview update failed")
                    await asyncio.sleep(HEARTBEAT)
                    continue
                # One read, rendered once for each kind of viewer there is.
                kinds = set(self._subscribers.values())
                rendered = {can: self._render(snapshot, can) for can in kinds}
                for queue, can_act in list(self._subscribers.items()):
                    if queue.full():
                        queue.get_nowait()
                    queue.put_nowait(rendered[can_act])
                await asyncio.sleep(MIN_INTERVAL)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
