"""X-Request-ID: read or made, echoed on every response, written on the access log line."""

from __future__ import annotations

import logging
import re

import httpx
import pytest


async def test_every_response_carries_a_request_id(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook_broker.access")
    made = await client.get("/_status")
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["X-Request-ID"])
    given = await client.get("/channels", headers={"X-Request-ID": "client-42.a"})
    assert given.headers["X-Request-ID"] == "client-42.a"
    for bad in ("with space", "x" * 129, "semi;colon"):
        r = await client.get("/channels", headers={"X-Request-ID": bad})
        assert r.headers["X-Request-ID"] != bad  # not written to the log as it came
    missing = await client.get("/channel/nope")
    assert missing.status_code == 404 and missing.headers["X-Request-ID"]
    lines = [r.getMessage() for r in caplog.records if r.name == "webhook_broker.access"]
    assert any(line.startswith("client-42.a GET /channels 200 ") for line in lines), lines
    assert any(
        line.startswith(f"{missing.headers['X-Request-ID']} GET /channel/nope 404")
        for line in lines
    )


@pytest.mark.parametrize(
    "extra_config", ["[gateway-auth]\nmode=hmac\nhmac-shared-secret=c2VjcmV0\n"]
)
async def test_a_refused_signature_has_its_request_id(client: httpx.AsyncClient) -> None:
    r = await client.get("/channels", headers={"X-Request-ID": "refused-1"})
    assert r.status_code == 401 and r.headers["X-Request-ID"] == "refused-1"
