"""The console in a real browser (pytest-playwright, Debian's Chromium) against a live broker
process on PostgreSQL, with real pull workers (the client library) in a thread of their own.

Set WEBHOOK_BROKER_SCREENSHOTS=1 to write the docs' screenshots (docs/img/console-*.png):
the overview, the dead-letter list and a job page. The shared set-up is in conftest.py."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import UTC, datetime, timedelta

import httpx
from playwright.sync_api import Browser, Locator, Page, expect

from tests.ui.conftest import (
    ADMIN,
    READER,
    WAIT_MS,
    admin_http,
    client,
    kill_all,
    publish,
    run,
    shot,
    signed_in,
)

expect.set_options(timeout=WAIT_MS)


class SlowWorker:
    """A worker acking one job at a time until stopped, so that depth falls while a page
    watches (its pause lets time pass on purpose: the page must see the fall, not its end)."""

    def __init__(self, url: str, consumer: str) -> None:
        self.url, self.consumer = url, consumer
        self.stopping = threading.Event()
        self.acked = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with client(self.url) as b:
            worker = b.consumer(
                self.consumer, self.consumer, consumer_token=f"{self.consumer}-token"
            )
            while not self.stopping.is_set():
                for job in await worker.fetch(1, expires=1):
                    await job.ack()
                    self.acked += 1
                await asyncio.sleep(0.4)

    def __enter__(self) -> SlowWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)


def queued_cell(page: Page, consumer: str) -> Locator:
    return page.locator(f'tr[data-key="{consumer}/{consumer}"] td[data-metric="queued"]')


def test_depth_falls_on_the_overview_while_a_worker_pulls(broker: str, browser: Browser) -> None:
    publish(broker, "billing", [{"n": n} for n in range(40)], "depth")
    page = signed_in(browser, broker, ADMIN)
    cell = queued_cell(page, "billing")
    expect(cell).to_have_text("40")
    page.evaluate("window.__notReloaded = true")
    with SlowWorker(broker, "billing") as worker:
        expect(cell).not_to_have_text("40")
        first = int(cell.inner_text())
        expect(cell).not_to_have_text(str(first))
        assert int(cell.inner_text()) < first
        assert worker.acked > 0
    assert page.evaluate("window.__notReloaded") is True
    assert page.elsewhere == []  # type: ignore[attr-defined]


def test_a_dead_job_found_by_its_payload_inspected_requeued_and_delivered(
    broker: str, browser: Browser
) -> None:
    publish(broker, "fulfil", [{"order": {"id": f"o-{n}"}, "total": n} for n in range(12)], "order")
    kill_all(broker, "fulfil", 12, "card declined")
    page = signed_in(browser, broker, ADMIN)
    page.click('a[href="/ui/c/fulfil/fulfil"]')
    page.select_option("#status", "DEAD")
    page.fill("#payload", "order.id=o-7")
    page.click("form.filter button[type=submit]")
    rows = page.locator("table.jobs tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("order-7")
    shot(page, "dlq")
    rows.first.locator("a").click()
    expect(page.locator("#attempt-count")).to_have_text("1")
    expect(page.locator("#dead-reason")).to_contain_text("card declined")
    expect(page.locator("#payload")).to_contain_text('"id": "o-7"')
    # Its attempt history: the one attempt, ended by the worker's term with its reason.
    attempts = page.locator("#attempt-history tr.attempt")
    expect(attempts).to_have_count(1)
    expect(attempts.first.locator(".outcome")).to_have_text("term")
    expect(attempts.first.locator(".error")).to_have_text("card declined")
    shot(page, "job")
    page.click("text=Requeue")
    expect(page.locator("#confirm-count")).to_contain_text("1")
    page.click("form.confirm button[type=submit]")
    expect(page.locator(".done")).to_contain_text("requeued")
    job_url = page.url.split("?")[0]

    async def deliver() -> None:
        async with client(broker) as b:
            worker = b.consumer("fulfil", "fulfil", consumer_token="fulfil-token")
            job = await worker.next(expires=10)
            assert job is not None and job.message_id == "order-7"
            await job.ack()

    run(deliver)
    page.goto(job_url)
    expect(page.locator("h1 .status")).to_have_text("DELIVERED")
    page.goto("/ui/audit")
    expect(page.locator("table.audit")).to_contain_text("requeue-job")


def test_a_redrive_shows_its_progress_and_is_cancelled(broker: str, browser: Browser) -> None:
    publish(broker, "replay", [f"replay {n}" for n in range(30)], "replay")
    kill_all(broker, "replay", 30, "bad gateway")
    page = signed_in(browser, broker, ADMIN)
    page.goto("/ui/c/replay/replay?status=DEAD")
    page.click("text=Redrive matching")
    expect(page.locator("#confirm-count")).to_contain_text("30")
    page.fill("#per_second", "2")
    page.click("form.confirm button[type=submit]")
    expect(page.locator("#redrive-status")).to_have_text("RUNNING")
    expect(page.locator("#redrive-total")).to_have_text("30")
    # Progress arrives by htmx polling, without a reload.
    expect(page.locator("#redrive-moved")).not_to_have_text("0")
    page.click("text=Cancel redrive")
    expect(page.locator("#redrive-status")).to_have_text("CANCELLED")
    assert int(page.locator("#redrive-moved").inner_text()) < 30
    page.goto("/ui/audit")
    audit = page.locator("table.audit")
    expect(audit).to_contain_text("redrive-matching")
    expect(audit).to_contain_text("cancel-redrive")


def test_the_reader_sees_everything_and_can_do_nothing(broker: str, browser: Browser) -> None:
    page = signed_in(browser, broker, READER)
    expect(page.locator("header .role")).to_contain_text("read-only")
    expect(page.locator('tr[data-key="fulfil/fulfil"]')).to_be_visible()
    page.goto("/ui/c/fulfil/fulfil?status=ANY")
    expect(page.locator("table.jobs tbody tr").first).to_be_visible()
    assert page.locator("a.action").count() == 0
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value")
    refused = page.request.post(
        "/ui/c/fulfil/fulfil/do/purge-dlq", form={"csrf": csrf or ""}, max_redirects=0
    )
    assert refused.status == 403 and "reads only" in refused.text()
    assert page.request.get("/ui/c/fulfil/fulfil/confirm/purge-dlq").status == 403
    paused = page.request.post(
        "/ui/c/fulfil/fulfil/do/pause", form={"csrf": csrf or ""}, max_redirects=0
    )
    assert paused.status == 403 and "reads only" in paused.text()


def test_an_action_without_the_csrf_token_is_refused(broker: str, browser: Browser) -> None:
    page = signed_in(browser, broker, ADMIN)
    refused = page.request.post("/ui/c/fulfil/fulfil/do/purge-dlq", form={}, max_redirects=0)
    assert refused.status == 403 and "CSRF" in refused.text()
    wrong = page.request.post(
        "/ui/c/fulfil/fulfil/do/purge-dlq", form={"csrf": "guess"}, max_redirects=0
    )
    assert wrong.status == 403
    # Nor does a request without the session cookie get anywhere.
    anonymous = httpx.post(f"{broker}/ui/c/fulfil/fulfil/do/purge-dlq", data={"csrf": "x"})
    assert anonymous.status_code == 401
    assert re.search("sign in", anonymous.text, re.I)


def fetch_one(url: str, expires: float) -> str | None:
    """What one pull of the paused channel's worker gets within `expires` seconds."""

    async def go() -> str | None:
        async with client(url) as b:
            worker = b.consumer("paused", "paused", consumer_token="paused-token")
            jobs = await worker.fetch(1, expires=expires)
            for job in jobs:
                await job.ack()
            return jobs[0].message_id if jobs else None

    return run(go)


def test_a_consumer_paused_and_resumed_in_the_console(broker: str, browser: Browser) -> None:
    page = signed_in(browser, broker, ADMIN)
    page.goto("/ui/c/paused/paused")
    page.click("#pause")
    expect(page.locator("form.confirm")).to_contain_text("publishes are still stored")
    page.click("form.confirm button[type=submit]")
    expect(page.locator(".done")).to_contain_text("paused")
    expect(page.locator("h1 #paused")).to_have_text("paused")
    publish(broker, "paused", ["held"], "held")
    # Stored, and not handed out: the pull waits out its expiry with nothing.
    assert fetch_one(broker, 2) is None
    page.click("#resume")
    page.click("form.confirm button[type=submit]")
    expect(page.locator(".done")).to_contain_text("resumed")
    expect(page.locator("h1 #paused")).to_have_count(0)
    assert fetch_one(broker, 10) == "held-0"
    page.goto("/ui/audit")
    audit = page.locator("table.audit")
    expect(audit).to_contain_text("pause")
    expect(audit).to_contain_text("resume")


def test_the_overview_and_the_consumer_page_show_a_pause_and_its_end(
    broker: str, browser: Browser
) -> None:
    page = signed_in(browser, broker, ADMIN)
    state = page.locator('tr[data-key="held/held"] .paused')
    expect(page.locator('tr[data-key="held/held"]')).to_be_visible()
    expect(state).to_have_count(0)
    until = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    with admin_http(broker) as http:
        r = http.put("/channel/held/consumer/held/pause", data={"until": until.isoformat()})
        assert r.status_code == 200, r.text
    # On the open page, by the live update: no reload.
    words = f"until {until:%Y-%m-%d %H:%M:%S} UTC"
    expect(state).to_have_text(f"paused {words}")
    assert state.get_attribute("data-paused-until") == until.isoformat()
    # The docs' overview: every test's consumers, one of them paused, charts drawn.
    expect(page.locator('tr[data-key="billing/billing"] .spark canvas')).to_have_count(1)
    shot(page, "overview")
    page.click('a[href="/ui/c/held/held"]')
    expect(page.locator("h1 #paused")).to_have_text("paused")
    expect(page.locator("#pause-state")).to_contain_text(f"Paused {words}")
    expect(page.locator("#pause-state time")).to_have_attribute("datetime", until.isoformat())
    expect(page.locator("#resume")).to_be_visible()
    with admin_http(broker) as http:
        assert http.put("/channel/held/consumer/held/pause").status_code == 200
    page.reload()
    expect(page.locator("#pause-state")).to_contain_text("Paused until resumed")
    expect(page.locator("#pause-state time")).to_have_count(0)
    page.goto("/ui/")
    expect(state).to_have_text("paused until resumed")
    assert state.get_attribute("data-paused-until") == ""
    with admin_http(broker) as http:
        assert http.delete("/channel/held/consumer/held/pause").status_code == 200
    expect(state).to_have_count(0)
    page.goto("/ui/c/held/held")
    expect(page.locator("#pause-state")).to_have_count(0)
    expect(page.locator("#pause")).to_be_visible()
