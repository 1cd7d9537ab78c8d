"""Pausing a consumer (PUT / DELETE .../pause): claims stop on every path, publishes are
still stored, waiting pulls keep waiting and take the jobs once it resumes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from app.runtime import Runtime
from app.store.queue import Named
from tests.helpers.pull import (
    CHANNEL,
    PullConsumer,
    consumer_pk,
    publish,
    pull,
    pull_jobs,
    set_state,
    setup_channel,
    until_waiting,
)


@pytest.fixture
async def k1(client: httpx.AsyncClient) -> PullConsumer:
    return (await setup_channel(client, "k1"))[0]


async def pause(client: httpx.AsyncClient, who: PullConsumer, **form: str) -> httpx.Response:
    return await client.put(f"{who.base}/pause", data=form or None)


async def test_a_paused_consumer_stores_but_hands_out_nothing_until_resumed(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    r = await pause(client, k1)
    assert r.status_code == 200, r.text
    assert (r.json()["Paused"], r.json()["PausedUntil"]) == (True, None)
    assert (await client.get(k1.base)).json()["Paused"] is True
    await publish(client, "kept", message_id="m1")
    # Stored: its job is there, queued.
    r = await client.get(f"/channel/{CHANNEL}/message/m1")
    assert r.status_code == 200, r.text
    assert await pull_jobs(client, k1) == []
    # Every claim path: by credentials (above), by primary key (the bridge's and a waiting
    # pull's), with a max-ack-pending cap, and the Go API's NextState INFLIGHT.
    pk = await consumer_pk(runtime, k1.id)
    claimed = await runtime.queue.claim(Named(pk), limit=10, default_ack_wait=30)
    assert claimed.jobs == []
    capped = await runtime.queue.claim(Named(pk), limit=10, default_ack_wait=30, max_ack_pending=5)
    assert capped.jobs == []
    # A waiting pull keeps waiting while paused, and takes the job at once on the resume.
    waiting = asyncio.create_task(pull(client, k1, batch=1, expires=30))
    await until_waiting(runtime, pk)
    await asyncio.sleep(0)  # the round the pull started has run and found nothing
    assert not waiting.done()
    r = await client.delete(f"{k1.base}/pause")
    assert r.status_code == 200, r.text
    assert (r.json()["Paused"], r.json()["PausedUntil"]) == (False, None)
    answer = await asyncio.wait_for(waiting, 10)
    assert answer.status_code == 200, answer.text
    [job] = answer.json()["Jobs"]
    assert job["Attempt"] == 1


async def test_acks_go_on_while_paused(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    await publish(client, "x")
    [job] = await pull_jobs(client, k1)
    assert (await pause(client, k1)).status_code == 200
    r = await client.post(f"{k1.job(job['ID'])}/ack", json={"type": "ack"}, headers=k1.auth)
    assert r.status_code == 202, r.text


async def test_a_timed_pause_ends_by_itself(
    client: httpx.AsyncClient, k1: PullConsumer, runtime: Runtime
) -> None:
    until = datetime.now(UTC) + timedelta(seconds=2)
    r = await pause(client, k1, until=until.isoformat())
    assert r.status_code == 200, r.text
    assert r.json()["Paused"] is True
    assert abs(datetime.fromisoformat(r.json()["PausedUntil"]) - until) < timedelta(seconds=1)
    await publish(client, "later")
    # A pull waiting through the pause's end is served then, with no resume announced.
    answer = await pull(client, k1, batch=1, expires=20)
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["Jobs"]) == 1
    assert datetime.now(UTC) >= until
    assert (await client.get(k1.base)).json()["Paused"] is False


async def test_a_pause_in_the_past_resumes(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    assert (await pause(client, k1)).status_code == 200
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    r = await pause(client, k1, until=past)
    assert r.status_code == 200, r.text
    assert r.json()["Paused"] is False
    await publish(client, "x")
    assert len(await pull_jobs(client, k1)) == 1


async def test_the_go_apis_inflight_is_refused_while_paused(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    await publish(client, "x")
    r = await client.get(f"{k1.base}/queued-jobs", headers=k1.auth)
    assert r.status_code == 200, r.text
    [queued] = r.json()["Result"]
    assert (await pause(client, k1)).status_code == 200
    r = await set_state(client, k1, queued["ID"], {"NextState": "INFLIGHT"})
    assert r.status_code == 409, r.text
    assert "paused" in r.text


@pytest.mark.parametrize(
    ("form", "status"),
    [({"until": "tomorrow"}, 400), ({"until": "2030-01-01T00:00:00"}, 400)],
)
async def test_bad_pauses_are_400(
    client: httpx.AsyncClient, k1: PullConsumer, form: dict[str, str], status: int
) -> None:
    r = await pause(client, k1, **form)
    assert r.status_code == status, r.text
    assert "until" in r.json()["detail"]


async def test_pause_needs_a_form_or_no_body(client: httpx.AsyncClient, k1: PullConsumer) -> None:
    r = await client.put(f"{k1.base}/pause", json={"until": "x"})
    assert r.status_code == 415, r.text


async def test_pause_of_an_unknown_consumer_is_404(
    client: httpx.AsyncClient, k1: PullConsumer
) -> None:
    r = await client.put(f"/channel/{CHANNEL}/consumer/nobody/pause")
    assert r.status_code == 404
    r = await client.delete(f"/channel/{CHANNEL}/consumer/nobody/pause")
    assert r.status_code == 404
