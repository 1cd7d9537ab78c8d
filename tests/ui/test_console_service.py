"""The console's service on both databases: the overview from the counters, the bounded payload
search, bulk requeue and delete of what a filter matches (with its audit entries), and the
breaker reset."""

from __future__ import annotations

import json

import httpx
import pytest

from app.domain.console import Actor, parse_job_filter
from app.domain.errors import Forbidden, InvalidInput
from app.runtime import Runtime
from tests.helpers.pull import CHANNEL, publish, pull_jobs, set_state, setup_channel

ADMIN = Actor("admin", "s1")
READER = Actor("reader", "s2")


async def _dead_jobs(client: httpx.AsyncClient, count: int) -> list[str]:
    (who,) = await setup_channel(client, "k1")
    for n in range(count):
        body = json.dumps({"order": {"id": f"o-{n}", "n": n}, "note": "fragile" if n % 2 else "ok"})
        await publish(
            client, body, message_id=f"m-{n}", headers={"Content-Type": "application/json"}
        )
    jobs = await pull_jobs(client, who, batch=count)
    for pulled in jobs:
        r = await set_state(client, who, pulled["ID"], {"NextState": "DEAD"})
        assert r.status_code == 202, r.text
    return [j["ID"] for j in jobs]


async def test_overview_counts_and_a_payload_field_search(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await _dead_jobs(client, 6)
    await publish(client, "queued one")
    overview = await runtime.console.overview()
    (row,) = overview.consumers
    assert (row.channel_id, row.consumer_id, row.dead, row.queued, row.due) == (
        CHANNEL,
        "k1",
        6,
        1,
        1,
    )
    assert overview.unaccounted[(CHANNEL, "k1")] == 0

    found = await runtime.console.search(
        CHANNEL, "k1", parse_job_filter(status="DEAD", payload="order.id=o-3"), None
    )
    assert [c.message.message_id for c in found.jobs] == ["m-3"]
    assert found.scanned == 6
    text = await runtime.console.search(
        CHANNEL, "k1", parse_job_filter(status="DEAD", payload="fragile"), None
    )
    assert sorted(c.message.message_id for c in text.jobs) == ["m-1", "m-3", "m-5"]


async def test_bulk_requeue_and_delete_of_a_filter_are_audited(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await _dead_jobs(client, 4)
    fragile = parse_job_filter(status="DEAD", payload="note=fragile")
    assert len((await runtime.console.matching(CHANNEL, "k1", fragile)).ids) == 2
    with pytest.raises(Forbidden):
        await runtime.console.requeue_matching(READER, CHANNEL, "k1", fragile)
    assert await runtime.console.requeue_matching(ADMIN, CHANNEL, "k1", fragile) == 2
    assert await runtime.console.delete_matching(ADMIN, CHANNEL, "k1", parse_job_filter()) == 2
    (row,) = (await runtime.console.overview()).consumers
    assert (row.dead, row.queued) == (0, 2)
    assert (await runtime.console.overview()).unaccounted[(CHANNEL, "k1")] == 0
    entries = await runtime.console.audit()
    assert [(e.action, e.jobs, e.role, e.session) for e in entries] == [
        ("delete-matching", 2, "admin", "s1"),
        ("requeue-matching", 2, "admin", "s1"),
    ]
    with pytest.raises(InvalidInput):
        await runtime.console.requeue_matching(
            ADMIN, CHANNEL, "k1", parse_job_filter(status="QUEUED")
        )


async def test_a_bounded_window_pages_on_where_the_scan_stopped(
    client: httpx.AsyncClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _dead_jobs(client, 5)
    monkeypatch.setattr("app.services.console.SCAN_ROWS", 2)
    which = parse_job_filter(status="DEAD", payload="order.n=0")
    first = await runtime.console.search(CHANNEL, "k1", which, None)
    assert (first.jobs, first.scanned) == ([], 2)
    seen: list[str] = []
    before = first.next_before
    while before is not None:
        page = await runtime.console.search(CHANNEL, "k1", which, before)
        seen += [c.message.message_id for c in page.jobs]
        before = page.next_before
    assert seen == ["m-0"]


async def test_a_list_and_a_text_search_read_no_payloads(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await _dead_jobs(client, 3)
    for which in (parse_job_filter(status="DEAD"), parse_job_filter(payload="fragile")):
        page = await runtime.console.search(CHANNEL, "k1", which, None)
        assert page.jobs and {c.message.payload for c in page.jobs} == {b""}
    text = parse_job_filter(status="DEAD", payload="fragile")
    assert len((await runtime.console.matching(CHANNEL, "k1", text)).ids) == 1


async def test_a_field_search_reads_payloads_up_to_its_budget_and_pages_on(
    client: httpx.AsyncClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _dead_jobs(client, 5)
    # One byte: each read takes the newest payload holding the needle (the one crossing it).
    monkeypatch.setattr("app.services.console.PAYLOAD_BUDGET", 1)
    # "o" is in every payload ("order"), "fragile" in m-1's and m-3's.
    for search, found, pages in (("order.id=o", [], 5), ("note=fragile", ["m-3", "m-1"], 2)):
        which = parse_job_filter(status="DEAD", payload=search)
        seen: list[str] = []
        read: list[int] = []
        before = None
        while not read or before is not None:
            page = await runtime.console.search(CHANNEL, "k1", which, before)
            seen += [c.message.message_id for c in page.jobs]
            assert {c.message.payload for c in page.jobs} <= {b""}
            read.append(page.scanned)
            before = page.next_before
        assert (seen, len(read)) == (found, pages)
    # The first page read m-4 and m-3 (where the budget ran out), the second the rest.
    assert read == [2, 3]

    fragile = parse_job_filter(status="DEAD", payload="note=fragile")
    cut = await runtime.console.matching(CHANNEL, "k1", fragile)
    assert (len(cut.ids), cut.more, cut.cut) == (1, False, True)
    monkeypatch.setattr("app.services.console.PAYLOAD_BUDGET", 1 << 20)
    whole = await runtime.console.matching(CHANNEL, "k1", fragile)
    assert (len(whole.ids), whole.more, whole.cut) == (2, False, False)
