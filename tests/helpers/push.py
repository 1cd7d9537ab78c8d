"""An in-process broker (a started runtime and a client of its API) with the channel `c1`, the
producer `p1` and the push consumer `k1`: the push suites publish to it and wait for a job's
status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from app.api.app import create_app
from app.config import Config
from app.runtime import Runtime
from tests.helpers.waiting import eventually

CONSUMER_AUTH = {"X-Broker-Channel-Token": "ct", "X-Broker-Consumer-Token": "kt"}


@asynccontextmanager
async def broker(
    config: Config, *, sweeper: bool = False, dispatcher: bool = False
) -> AsyncIterator[httpx.AsyncClient]:
    """A started runtime, with the background parts asked for, and a client of its API."""
    rt = Runtime(config, run_sweeper=sweeper, run_dispatcher=dispatcher)
    await rt.start()
    try:
        transport = httpx.ASGITransport(app=create_app(config, rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            yield http
    finally:
        await rt.stop()


async def setup_push(http: httpx.AsyncClient, url: str) -> None:
    assert (await http.put("/channel/c1", data={"token": "ct"})).status_code == 200
    assert (await http.put("/producer/p1", data={"token": "pt"})).status_code == 200
    r = await http.put("/channel/c1/consumer/k1", data={"token": "kt", "callbackUrl": url})
    assert r.status_code == 200, r.text


async def publish(http: httpx.AsyncClient, body: bytes, message_id: str, **headers: str) -> None:
    r = await http.post(
        "/channel/c1/broadcast",
        content=body,
        headers={
            "X-Broker-Channel-Token": "ct",
            "X-Broker-Producer-ID": "p1",
            "X-Broker-Producer-Token": "pt",
            "X-Broker-Message-ID": message_id,
            **headers,
        },
    )
    assert r.status_code == 201, r.text


async def job_of(http: httpx.AsyncClient, message_id: str) -> dict[str, object]:
    r = await http.get(f"/channel/c1/message/{message_id}")
    assert r.status_code == 200, r.text
    jobs = r.json()["Jobs"]
    assert len(jobs) == 1
    job_id = jobs[0]["ID"]
    r = await http.get(f"/channel/c1/consumer/k1/job/{job_id}", headers=CONSUMER_AUTH)
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


async def wait_for_status(
    http: httpx.AsyncClient, message_id: str, status: str, within: float = 20.0
) -> dict[str, object]:
    async def reached() -> dict[str, object]:
        job = await job_of(http, message_id)
        assert job["Status"] == status, f"status {job['Status']}"
        return job

    return await eventually(reached, within, what=f"the job of {message_id} is {status}")
