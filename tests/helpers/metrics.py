"""The broker's Prometheus exposition, read into samples a test can look up."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


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
