"""The console's limits over real HTTP (uvicorn in the test's loop: the ASGI test transport
would buffer a stream): a bounded number of open overview streams per process, each ending
when its session does; failed sign-ins from one address held back; an open (tokenless)
console answering loopback names only; the sign-in form's cookie Secure over HTTPS."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest

from app.api.app import create_app
from app.config import Config, load_config_text
from app.runtime import Runtime
from tests.helpers.live import served
from tests.helpers.waiting import eventually

ADMIN = "limits-admin-token"


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture
def extra_config() -> str:
    # A quarter of 4 connections: one overview page per process.
    return f"[http]\nadmin-token={ADMIN}\nmax-concurrency=4\n"


async def _signin(client: httpx.AsyncClient, token: str) -> httpx.Response:
    form = await client.get("/ui/signin")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert found, form.text
    return await client.post(
        "/ui/signin", data={"csrf": found.group(1), "token": token, "next": "/ui/"}
    )


async def _first_line(stream: httpx.Response) -> str:
    async for line in stream.aiter_lines():
        return line
    return ""


async def test_open_streams_are_capped_and_one_closed_frees_its_place(
    config: Config, runtime: Runtime
) -> None:
    async with served(config, runtime) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await _signin(client, ADMIN)).status_code == 303
        async with client.stream("GET", "/ui/events") as first:
            assert first.status_code == 200
            assert await _first_line(first) == ": connected"
            refused = await client.get("/ui/events")
            assert refused.status_code == 503, refused.text
            assert "1 overview pages are open" in refused.text
            assert refused.headers["Retry-After"] == "30"

        async def reopened() -> bool:
            async with client.stream("GET", "/ui/events") as again:
                return again.status_code == 200 and await _first_line(again) == ": connected"

        assert await eventually(reopened, what="a closed stream's place taken by a new one")


async def test_a_stream_ends_when_its_session_expires(
    config: Config, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.ui.sessions.LIFETIME_SECONDS", 2)
    async with (
        served(config, runtime) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        assert (await _signin(client, ADMIN)).status_code == 303
        async with client.stream("GET", "/ui/events") as stream:
            assert stream.status_code == 200

            async def read_to_the_end() -> list[str]:
                return [line async for line in stream.aiter_lines()]

            # Without the expiry the stream goes on (keep-alives every 15 s) and this times out.
            lines = await asyncio.wait_for(read_to_the_end(), 60)
        assert lines[0] == ": connected"


async def test_failed_sign_ins_from_one_address_wait(config: Config, runtime: Runtime) -> None:
    app = create_app(config, runtime)

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        return httpx.AsyncClient(transport=transport, base_url="http://broker.test")

    async with client("10.0.0.7") as guesser, client("10.0.0.8") as other:
        for n in range(10):
            assert (await _signin(guesser, f"guess-{n}")).status_code == 401
        held = await _signin(guesser, ADMIN)
        assert held.status_code == 429, held.text
        assert "too many failed sign-ins" in held.text
        assert 0 < int(held.headers["Retry-After"]) <= 60
        assert (await _signin(other, ADMIN)).status_code == 303


async def test_the_sign_in_forms_cookie_is_secure_over_https(
    config: Config, runtime: Runtime
) -> None:
    transport = httpx.ASGITransport(app=create_app(config, runtime))
    async with httpx.AsyncClient(transport=transport, base_url="https://broker.test") as https:
        form = await https.get("/ui/signin")
        assert "secure" in form.headers["set-cookie"].lower()
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
        form = await http.get("/ui/signin")
        assert "secure" not in form.headers["set-cookie"].lower()


@pytest.mark.parametrize(
    ("base_url", "status"),
    [
        ("http://127.0.0.1:8080", 200),
        ("http://localhost:8080", 200),
        ("http://localhost", 200),
        ("http://[::1]:8080", 200),
        ("http://rebound.example:8080", 403),
        ("http://127.0.0.1.nip.io:8080", 403),
        ("http://localhost.example", 403),
    ],
)
async def test_an_open_console_answers_loopback_names_only(
    rdbms: str, caplog: pytest.LogCaptureFixture, base_url: str, status: int
) -> None:
    config = load_config_text(rdbms)  # the loopback listener, no token
    runtime = Runtime(config)
    await runtime.start()
    try:
        with caplog.at_level(logging.WARNING, logger="app.ui"):
            app = create_app(config, runtime)
        assert "open without a token on the loopback listener" in caplog.text
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            form = await client.get("/ui/signin")
            assert form.status_code == status, form.text
            if status == 403:
                assert "answers only requests to localhost" in form.text
                posted = await client.post("/ui/signin", data={"csrf": "x"})
                assert posted.status_code == 403
            else:
                assert (await _signin(client, "")).status_code == 303
    finally:
        await runtime.stop()


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2:8080", True),
        ("LOCALHOST:1", True),
        ("[::1]", True),
        ("[::1]:80", True),
        ("::1", False),
        ("[::1]x", False),
        ("127.0.0.1:", False),
        ("127.0.0.1:80:80", False),
        ("127.0.0.1:８0", False),
        ("", False),
        ("evil.test", False),
    ],
)
def test_host_names(host: str, allowed: bool) -> None:
    from app.ui.routes import host_allowed, loopback_hosts

    assert host_allowed(host, loopback_hosts("127.0.0.2")) is allowed
