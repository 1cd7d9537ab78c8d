"""Playwright (pytest-playwright) drives Debian's Chromium here, as tests/test_docs.py does;
`playwright install` is never run.

The browser tests' shared set-up: a module's own browser and live broker process (on
PostgreSQL, with an admin and a reader token and a pull consumer per channel of CHANNELS), and
the steps the tests take with real clients (publishing, a worker that kills every job, signing
in)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect
from webhook_broker_client import Broker

from tests.conftest import fresh_database
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, chromium
from tests.helpers.processes import BrokerProcess

ADMIN = "console-admin-token"
READER = "console-reader-token"
TOKEN = "channel-token"
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
WAIT_MS = 30_000
# A channel (and its one pull consumer of the same name) each, so that one test's messages
# are no other's jobs.
CHANNELS = ("billing", "fulfil", "replay", "paused", "held")
DESKTOP: ViewportSize = {"width": 1280, "height": 900}

T = TypeVar("T")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


def run(make: Callable[[], Awaitable[T]]) -> T:
    """An async step in a thread of its own: Playwright's sync API keeps an event loop
    running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """The module's own browser, not pytest-playwright's session one: Playwright's sync API
    keeps an event loop running in this thread while it lives, and the async tests that run
    after the module need the thread's loop back."""
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A live broker process of the module's own; its base URL."""
    request.getfixturevalue("pg_template")
    section = fresh_database("postgresql", request.getfixturevalue("pg_base_url"), None)
    config = tmp_path_factory.mktemp("console") / "broker.cfg"
    config.write_text(section + f"[http]\nadmin-token={ADMIN}\nreader-token={READER}\n")
    process = BrokerProcess(config)
    process.start()

    with admin_http(process.url) as http:
        assert http.put("/producer/web", data={"token": "web-token"}).status_code == 200
        for name in CHANNELS:
            assert http.put(f"/channel/{name}", data={"token": TOKEN}).status_code == 200
            form = {"token": f"{name}-token", "type": "pull", "ackWait": "60"}
            r = http.put(f"/channel/{name}/consumer/{name}", data=form)
            assert r.status_code == 200, r.text
    try:
        yield process.url
    finally:
        process.stop()


def admin_http(url: str) -> httpx.Client:
    """The broker's HTTP API with the admin token."""
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})


def client(url: str) -> Broker:
    return Broker(
        url,
        admin_token=ADMIN,
        producer_id="web",
        producer_token="web-token",
        channel_tokens={name: TOKEN for name in CHANNELS},
    )


def publish(url: str, channel: str, payloads: list[Any], prefix: str) -> None:
    async def go() -> None:
        async with client(url) as b:
            for n, payload in enumerate(payloads):
                await b.publish(channel, payload, message_id=f"{prefix}-{n}")

    run(go)


def kill_all(url: str, consumer: str, count: int, reason: str) -> None:
    """A worker that fails every job it takes, for good (DEAD)."""

    async def go() -> None:
        async with client(url) as b:
            worker = b.consumer(consumer, consumer, consumer_token=f"{consumer}-token")
            left = count
            while left:
                for job in await worker.fetch(min(left, 50), expires=5):
                    await job.term(reason)
                    left -= 1

    run(go)


def signed_in(browser: Browser, url: str, token: str, viewport: ViewportSize | None = None) -> Page:
    """A page of a new browser context, signed in with `token`, on the overview. It records
    every request to anywhere but the broker in `page.elsewhere`."""
    context = browser.new_context(base_url=url, viewport=viewport or DESKTOP)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    elsewhere: list[str] = []
    page.on(
        "request",
        lambda r: elsewhere.append(r.url) if not r.url.startswith((url, "data:")) else None,
    )
    page.goto("/ui/")
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.locator("h1")).to_have_text("Overview")
    page.elsewhere = elsewhere  # type: ignore[attr-defined]
    return page


def shot(page: Page, name: str) -> None:
    """Set WEBHOOK_BROKER_SCREENSHOTS=1 to write the docs' screenshots (docs/img/console-*.png)."""
    if os.environ.get("WEBHOOK_BROKER_SCREENSHOTS"):
        DOCS_IMG.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / f"console-{name}.png"), full_page=True)
