"""Open operator-console pages (issue 38), as the bench's pull-console scenario and the load
check (tests/ui/test_console_load.py) hold them: each page is a plain HTTP client holding the
overview's live stream (`GET /ui/events`, server-sent events) open with a signed-in session
cookie, and counting the `overview` updates it receives.

No browser: what a page costs the broker is its event stream (the table it draws comes in the
events), so an HTTP client reading the stream costs the server what a browser tab would.
Pages are spread over the API processes given, round-robin, as a load balancer would. It
lives in devtools/ so that neither the bench nor the tests import the other.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from devtools.tasks import Background

# The overview statement's own column alias (app/store/console.py) and the ledger read's pair
# of aliases (app/store/ledger.py, the unfiltered read the overview makes): how the console's
# statements are told apart from the broker's in pg_stat_statements. A /metrics scrape runs the
# same ledger read; nothing scrapes during the windows this counts.
OVERVIEW_MARK = "AS oldest_due_at"
LEDGER_MARKS = ("AS removed", "AS held")
# Each overview read runs in one transaction of its own (app/services/console.py): BEGIN and
# COMMIT, which pg_stat_statements counts only in total, over every client of the database.
TRANSACTION_STATEMENTS = 2


def console_statement(query: str) -> str | None:
    """Which of the console's reads a pg_stat_statements text is ("overview", "ledger"), if any.
    The ledger read filtered by consumer (the job status API's) is not the console's."""
    if OVERVIEW_MARK in query:
        return "overview"
    if all(m in query for m in LEDGER_MARKS) and "WHERE consumer.pk" not in query:
        return "ledger"
    return None


@dataclass
class ConsoleCost:
    """The console's statements in a window, from two pg_stat_statements snapshots."""

    overview_reads: int
    ledger_reads: int
    seconds: float

    @property
    def statements(self) -> int:
        return (
            self.overview_reads + self.ledger_reads + TRANSACTION_STATEMENTS * self.overview_reads
        )

    @property
    def per_second(self) -> float:
        return self.statements / self.seconds if self.seconds > 0 else 0.0


def console_cost(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], seconds: float
) -> ConsoleCost:
    """`before`/`after`: queryid -> (query text, calls), one database's rows."""
    reads = {"overview": 0, "ledger": 0}
    for queryid, (query, calls) in after.items():
        kind = console_statement(query)
        if kind is not None:
            reads[kind] += calls - before.get(queryid, (query, 0))[1]
    return ConsoleCost(reads["overview"], reads["ledger"], seconds)


# How many times pg_stat_statements has evicted entries: an evicted console read comes back
# with its calls counted from zero, so a window in which this grew counts nothing reliably.
DEALLOC_SQL = "SELECT dealloc FROM pg_stat_statements_info"

STATEMENTS_SQL = (
    "SELECT queryid, query, calls FROM pg_stat_statements"
    " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND queryid IS NOT NULL"
)


@dataclass
class Page:
    url: str
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    updates: int = 0
    error: BaseException | None = None


class ConsolePages(Background):
    """`count` open overview pages over `urls` (API processes' base URLs), signed in with
    `token` (None: the listener is open, the sign-in form asks for no token)."""

    def __init__(self, urls: Sequence[str], count: int, token: str | None = None) -> None:
        super().__init__()
        self.urls = list(urls)
        self.token = token
        self.pages = [Page(self.urls[i % len(self.urls)]) for i in range(count)]
        self._clients: dict[str, httpx.AsyncClient] = {}

    async def open(self) -> None:
        for url in self.urls:
            client = httpx.AsyncClient(
                base_url=url,
                timeout=httpx.Timeout(30.0, read=None),
                limits=httpx.Limits(max_connections=len(self.pages) + 4),
            )
            self._clients[url] = client
            await _sign_in(client, self.token)
        self.start(*(self._hold(page) for page in self.pages))
        await self.connected()

    async def _hold(self, page: Page) -> None:
        client = self._clients[page.url]
        try:
            async with client.stream("GET", "/ui/events") as response:
                if response.status_code != 200:
                    raise RuntimeError(f"/ui/events answered {response.status_code}")
                async for line in response.aiter_lines():
                    if line == ": connected":
                        page.connected.set()  # subscribed: the server sends this after it
                    elif line == "event: overview":
                        page.updates += 1
        except Exception as exc:
            page.error = exc
            page.connected.set()
            raise

    def failed(self) -> list[str]:
        return [f"{p.url}: {p.error!r}" for p in self.pages if p.error is not None]

    async def connected(self, within: float = 60.0) -> None:
        async with asyncio.timeout(within):
            await asyncio.gather(*(p.connected.wait() for p in self.pages))
        if self.failed():
            raise RuntimeError("console pages failed: " + "; ".join(self.failed()))

    def fewest_updates(self) -> int:
        return min(p.updates for p in self.pages)

    async def updates(self, n: int, within: float) -> float:
        """Wait until every page has received `n` updates past the furthest page's count now;
        returns the seconds that took (the pages' window, measured by events rather than a
        clock set up front).

        Counted from the furthest page, not from each page's own count: a page that has not
        yet read the newest update (a busy loop reads 20 streams) would otherwise count it,
        and the updates before it, inside a window whose reads happened before it opened."""
        start = time.monotonic()
        goal = max(p.updates for p in self.pages) + n
        async with asyncio.timeout(within):
            while any(p.updates < goal for p in self.pages):
                if self.failed():
                    raise RuntimeError("console pages failed: " + "; ".join(self.failed()))
                await asyncio.sleep(0.05)
        return time.monotonic() - start

    async def close(self) -> None:
        await self.stop()  # a page's error is its own, in page.error
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def _sign_in(client: httpx.AsyncClient, token: str | None) -> None:
    """The sign-in form's own round trip: its CSRF token (and pre-sign-in cookie), then the
    post that sets the session cookie the client keeps."""
    form = await client.get("/ui/signin")
    form.raise_for_status()
    found = _CSRF.search(form.text)
    if found is None:
        raise RuntimeError("the sign-in form carries no CSRF token")
    data = {"csrf": found.group(1), "next": "/ui/", "token": token or ""}
    signed = await client.post("/ui/signin", data=data)
    if signed.status_code != 303:
        raise RuntimeError(f"console sign-in answered {signed.status_code}: {signed.text[:200]}")
