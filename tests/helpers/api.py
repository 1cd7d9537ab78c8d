"""Small HTTP helpers shared by the API contract tests (no fixtures here)."""

from __future__ import annotations

from datetime import timedelta
from email.utils import format_datetime, parsedate_to_datetime

import httpx

FORM_TYPE = "application/x-www-form-urlencoded"


async def put_form(
    client: httpx.AsyncClient,
    path: str,
    fields: dict[str, str] | None = None,
    *,
    since: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """A management PUT with a urlencoded form (httpx sets the content type for `data`)."""
    sent = dict(headers or {})
    if since is not None:
        sent["If-Unmodified-Since"] = since
    # An empty form still needs the form content type; httpx omits it for an empty dict.
    if not fields:
        sent.setdefault("Content-Type", FORM_TYPE)
        return await client.put(path, content=b"", headers=sent)
    return await client.put(path, data=fields, headers=sent)


async def create(
    client: httpx.AsyncClient, path: str, fields: dict[str, str] | None = None
) -> httpx.Response:
    response = await put_form(client, path, fields)
    assert response.status_code == 200, response.text
    return response


def an_earlier_date(last_modified: str) -> str:
    """A well-formed If-Unmodified-Since one day before the given Last-Modified."""
    return format_datetime(parsedate_to_datetime(last_modified) - timedelta(days=1), usegmt=True)


async def setup_channel(
    client: httpx.AsyncClient,
    *,
    channel: str = "c1",
    channel_token: str = "ct",
    producer: str = "p1",
    producer_token: str = "pt",
    consumers: int = 0,
) -> None:
    """A channel, a producer and `consumers` pull consumers k0..kN-1."""
    await create(client, f"/channel/{channel}", {"token": channel_token})
    await create(client, f"/producer/{producer}", {"token": producer_token})
    for n in range(consumers):
        await create(
            client, f"/channel/{channel}/consumer/k{n}", {"token": f"kt{n}", "type": "pull"}
        )


def publish_headers(
    *,
    channel_token: str = "ct",
    producer: str = "p1",
    producer_token: str = "pt",
    **extra: str,
) -> dict[str, str]:
    headers = {
        "X-Broker-Channel-Token": channel_token,
        "X-Broker-Producer-ID": producer,
        "X-Broker-Producer-Token": producer_token,
    }
    headers.update({name.replace("_", "-"): value for name, value in extra.items()})
    return headers


async def all_pages(client: httpx.AsyncClient, path: str) -> list[str]:
    """Follow `next` links from the first page; returns every Result entry in order."""
    results: list[str] = []
    url: str | None = path
    while url:
        response = await client.get(url)
        assert response.status_code == 200, response.text
        body = response.json()
        results.extend(body["Result"])
        url = body["Pages"].get("next")
    return results
