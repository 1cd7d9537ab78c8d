"""The broker's Prometheus exposition, read into samples a test can look up."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.runtime import Runtime
from tests.helpers.pull import CHANNEL
from tests.helpers.waiting import eventually


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(r.text)
        for sample in family.samples
    }


async def pulls_waiting(client: httpx.AsyncClient) -> float:
    """How many long polls and streams wait in the process `client` talks to."""
    return (await scrape(client))[("webhook_broker_pulls_waiting", ())]


async def dispatcher_rounds(client: httpx.AsyncClient) -> float:
    """How many rounds through the push consumers the dispatcher of `client`'s process made."""
    return (await scrape(client))[("webhook_broker_push_dispatch_rounds_total", ())]


async def a_dispatcher_round(client: httpx.AsyncClient, within: float = 20.0) -> None:
    """Until a whole round of the dispatcher began after this call: it claimed whatever was
    due then (a round under way at the call may have looked before)."""
    start = await dispatcher_rounds(client)

    async def two_more() -> bool:
        return await dispatcher_rounds(client) >= start + 2

    await eventually(two_more, within, what="a whole dispatcher round after the call")


Ledger = dict[str, tuple[float, float, float]]


async def ledger(client: httpx.AsyncClient, runtime: Runtime) -> Ledger:
    """(published, removed, unaccounted) by consumer, read afresh."""
    runtime.metrics.snapshot.read_at = 0.0
    samples = await scrape(client)
    found: dict[str, dict[str, float]] = {}
    for (name, labels), value in samples.items():
        if name.startswith("webhook_broker_ledger_"):
            assert dict(labels)["channel"] == CHANNEL
            found.setdefault(dict(labels)["consumer"], {})[name] = value
    return {
        who: (
            series["webhook_broker_ledger_published_jobs"],
            series["webhook_broker_ledger_removed_jobs"],
            series["webhook_broker_ledger_unaccounted_jobs"],
        )
        for who, series in found.items()
    }
