"""The console over HTTP (no browser): sign-in with either token, the cookie holding no token,
CSRF refusals, the reader refused every action, and the console off where it must be."""

from __future__ import annotations

import re

import httpx
import pytest

from app.api.app import create_app
from app.config import load_config_text
from app.runtime import Runtime

ADMIN = "admin-secret-token"
READER = "reader-secret-token"


@pytest.fixture
def extra_config() -> str:
    return f"[http]\nadmin-token={ADMIN}\nreader-token={READER}\n"


@pytest.fixture
def backend() -> str:
    return "sqlite"


async def _signin(client: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await client.get("/ui/signin")
    assert form.status_code == 200
    csrf = _csrf(form.text)
    return await client.post("/ui/signin", data={"csrf": csrf, "token": token, "next": "/ui/"})


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


async def _setup(client: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    assert (await client.put("/channel/c1", data={"token": "t"}, headers=auth)).status_code == 200
    r = await client.put(
        "/channel/c1/consumer/k1", data={"token": "k", "type": "pull"}, headers=auth
    )
    assert r.status_code == 200, r.text


async def test_admin_signs_in_and_acts_only_with_the_csrf_token(
    client: httpx.AsyncClient,
) -> None:
    await _setup(client)
    assert (await client.get("/ui/")).status_code == 303  # to the sign-in form
    wrong = await _signin(client, "not-a-token")
    assert wrong.status_code == 401
    signed = await _signin(client, ADMIN)
    assert signed.status_code == 303
    cookie = signed.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert ADMIN not in cookie
    page = await client.get("/ui/")
    assert page.status_code == 200 and "c1 / k1" in page.text
    assert "Content-Security-Policy" in page.headers
    csrf = _csrf(page.text)
    refused = await client.post("/ui/c/c1/k1/do/purge-dlq", data={})
    assert refused.status_code == 403 and "CSRF" in refused.text
    done = await client.post("/ui/c/c1/k1/do/purge-dlq", data={"csrf": csrf})
    assert done.status_code == 303
    audit = await client.get("/ui/audit")
    assert "purge-dlq" in audit.text and "sign-in" in audit.text


async def test_the_reader_sees_and_cannot_act(client: httpx.AsyncClient) -> None:
    await _setup(client)
    assert (await _signin(client, READER)).status_code == 303
    page = await client.get("/ui/c/c1/k1")
    assert page.status_code == 200 and "read-only" in page.text
    assert "/confirm/" not in page.text
    assert (await client.get("/ui/c/c1/k1/confirm/purge-dlq")).status_code == 403
    csrf = _csrf(page.text)
    refused = await client.post("/ui/c/c1/k1/do/purge-dlq", data={"csrf": csrf})
    assert refused.status_code == 403 and "reads only" in refused.text


async def test_no_console_on_an_open_listener_that_is_not_loopback(
    rdbms: str, runtime: Runtime
) -> None:
    config = load_config_text(rdbms + "[http]\nlistener=0.0.0.0:8080\nallow-anonymous-admin=true\n")
    app = create_app(config, runtime)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://x"
    ) as http:
        assert (await http.get("/ui/signin")).status_code == 404
    off = create_app(load_config_text(rdbms + "[ui]\nenabled=false\n"), runtime)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=off), base_url="http://x"
    ) as http:
        assert (await http.get("/ui/signin")).status_code == 404
