"""A producer's metadata headers never travel beside the broker's own (in any case) nor carry
what HTTP cannot send: refused at publish with a 400 that names them, and filtered at
delivery for messages stored before the rule. A real receiver records the raw header list."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from sqlalchemy import update

from app.api.app import create_app
from app.config import Config
from app.domain.headers import forwardable, name_refusal, value_refusal
from app.runtime import Runtime
from app.services.publishing import metadata_headers
from app.store.schema import message
from tests.helpers.push import setup_push, wait_for_status
from tests.helpers.receiver import serving

TOKEN_HEADER = "X-Hook-Token"


@pytest.fixture
def extra_config() -> str:
    return (
        "[broker]\nmax-retry=2\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=4\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=2\n"
        f"token-header-name={TOKEN_HEADER}\nuser-agent=wb-test-agent\n"
    )


# -- the rule, as a table ------------------------------------------------------------------------

NAMES: list[tuple[str, str | None]] = [
    # (name, what the refusal says; None: it may be forwarded)
    ("traceparent", None),
    ("X-Tenant", None),
    ("Content-Encoding", None),
    ("Host", "connection header"),
    ("host", "connection header"),
    ("Content-Length", "connection header"),
    ("transfer-encoding", "connection header"),
    ("Connection", "connection header"),
    ("Keep-Alive", "connection header"),
    ("Upgrade", "connection header"),
    ("TE", "connection header"),
    ("Trailer", "connection header"),
    ("Expect", "connection header"),
    ("Proxy-Connection", "connection header"),
    ("proxy-anything", "connection header"),
    ("x-broker-signature", "the broker sets"),
    ("X-BROKER-MESSAGE-ID", "the broker sets"),
    ("X-Broker-Consumer-Token", "the broker sets"),
    ("x-broker-anything-new", "the broker sets"),
    ("x-hook-token", "the broker sets"),  # the configured token header, in another case
    ("webhook-id", "the broker sets"),
    ("Webhook-Timestamp", "the broker sets"),
    ("WEBHOOK-SIGNATURE", "the broker sets"),
    ("user-agent", "the broker sets"),
    ("content-type", "the broker sets"),
    ("X-Request-Id", "the broker sets"),
    # CGI-style receivers read "_" as "-": these would shadow the broker's own headers.
    ("X_Broker_Consumer_Token", "the broker sets"),
    ("webhook_signature", "the broker sets"),
    ("Content_Type", "the broker sets"),
    ("x_hook_token", "the broker sets"),
    ("Transfer_Encoding", "connection header"),
    ("Bad Header", "not a valid header name"),
    ("X-Order\x00", "not a valid header name"),
    ("X-Caf\xe9", "not a valid header name"),
    ("X-Colon:", "not a valid header name"),
    ("", "not a valid header name"),
]


@pytest.mark.parametrize(("name", "reason"), NAMES)
def test_name_rule(name: str, reason: str | None) -> None:
    refusal = name_refusal(name, TOKEN_HEADER)
    if reason is None:
        assert refusal is None
    else:
        assert refusal is not None and reason in refusal


VALUES: list[tuple[str, bool]] = [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
    ("with space\tand tab", True),
    ("", True),
    ("caf\xe9", False),  # latin-1 é, as Starlette decodes a UTF-8 byte
    ("caf\xc3\xa9", False),  # UTF-8 é, as its two bytes
    ("\u2603", False),
    ("a\x01b", False),
    ("a\rb", False),
    ("a\nInjected: yes", False),
    ("a\x00", False),
    ("del\x7f", False),
]


@pytest.mark.parametrize(("value", "sendable"), VALUES)
def test_value_rule(value: str, sendable: bool) -> None:
    assert (value_refusal("X-Meta", value) is None) is sendable


def test_publishing_refuses_what_a_push_cannot_carry_and_drops_credentials() -> None:
    given = {"X-Trace": "t", "x-trace": "t", "Authorization": "Bearer a", "X-Tenant": "acme"}
    names = "X-Trace, x-trace, Authorization, X-Broker-Channel-Token, X-Absent, X-Tenant"
    assert metadata_headers(names, given, TOKEN_HEADER) == {"X-Trace": "t", "X-Tenant": "acme"}
    with pytest.raises(Exception, match="webhook-id is a header the broker sets"):
        metadata_headers("X-Trace,webhook-id", {"webhook-id": "x", **given}, TOKEN_HEADER)
    with pytest.raises(Exception, match="value of X-Meta is not a valid HTTP header value"):
        metadata_headers("X-Meta", {"X-Meta": "caf\xe9"}, TOKEN_HEADER)


def test_delivery_filter_keeps_the_first_of_a_name_and_drops_the_rest() -> None:
    stored = {
        "X-Trace": "one",
        "x-trace": "two",
        "x-broker-signature": "forged",
        "Host": "elsewhere",
        "x-hook-token": "stolen",
        "Cookie": "c",
        "X-Bad": "caf\xe9",
        "X-Tenant": "acme",
    }
    assert forwardable(stored, TOKEN_HEADER) == {"X-Trace": "one", "X-Tenant": "acme"}


# -- a real receiver -----------------------------------------------------------------------------


@dataclass
class RawReceiver:
    """Records each POST's header list as it arrived: duplicates and case kept."""

    url: str = ""
    requests: list[list[tuple[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[list[tuple[str, str]]]:
        with self.lock:
            return list(self.requests)


@contextmanager
def raw_receiver() -> Iterator[RawReceiver]:
    receiver = RawReceiver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.requests.append(list(self.headers.items()))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    with serving(Handler, "raw-receiver") as base_url:
        receiver.url = base_url + "/hook"
        yield receiver


@pytest.fixture
def receiver() -> Iterator[RawReceiver]:
    with raw_receiver() as r:
        yield r


@pytest.fixture
async def rt(config: Config) -> AsyncIterator[Runtime]:
    """The API's runtime, without a dispatcher: a test starts one when it is ready."""
    runtime = Runtime(config)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


@pytest.fixture
async def http(config: Config, rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(config, rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as client:
        yield client


PRODUCER = {
    "X-Broker-Channel-Token": "ct",
    "X-Broker-Producer-ID": "p1",
    "X-Broker-Producer-Token": "pt",
}


async def broadcast(
    http: httpx.AsyncClient, message_id: str, headers: dict[str, str | bytes]
) -> httpx.Response:
    # As bytes: httpx encodes str header values as ASCII, and some of these are not.
    given = {**PRODUCER, "X-Broker-Message-ID": message_id, **headers}
    raw = {k.encode(): v if isinstance(v, bytes) else v.encode() for k, v in given.items()}
    return await http.post("/channel/c1/broadcast", content=b'{"n": 1}', headers=raw)


async def delivered_headers(
    config: Config, http: httpx.AsyncClient, receiver: RawReceiver, message_id: str
) -> list[tuple[str, str]]:
    """Run a dispatcher until the job of `message_id` is DELIVERED; its one request's headers."""
    dispatcher = Runtime(config, run_dispatcher=True)
    await dispatcher.start()
    try:
        await wait_for_status(http, message_id, "DELIVERED", within=15)
    finally:
        await dispatcher.stop()
    [headers] = receiver.received()
    return headers


def assert_one_of_each(headers: list[tuple[str, str]]) -> dict[str, str]:
    names = [name.lower() for name, _ in headers]
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert repeated == [], f"sent more than once: {repeated} in {headers}"
    return {name.lower(): value for name, value in headers}


# Each would have been sent beside (or, for Host and Content-Length, instead of) the broker's.
SHADOWING = [
    "x-broker-signature",
    "X-BROKER-SIGNATURE",
    "webhook-id",
    "webhook-signature",
    "Host",
    "content-length",
    "Transfer-Encoding",
    "X-Broker-Consumer-Token",
    "x-hook-token",
    "user-agent",
    "content-type",
    "x-broker-message-id",
    "Proxy-Authorization-Extra",
]


async def test_metadata_headers_the_broker_owns_are_refused_and_never_arrive_twice(
    config: Config, http: httpx.AsyncClient, receiver: RawReceiver
) -> None:
    await setup_push(http, receiver.url)
    for n, name in enumerate(SHADOWING):
        r = await broadcast(
            http,
            f"shadow-{n}",
            {"X-Broker-Metadata-Headers": f"traceparent,{name}", "traceparent": "tp", name: "x"},
        )
        assert r.status_code == 400, (name, r.status_code, r.text)
        assert name in r.text, r.text
    # What is refused was never stored: no job of any of them.
    assert (await http.get("/channel/c1/message/shadow-0")).status_code == 404
    r = await broadcast(
        http,
        "allowed",
        {
            "X-Broker-Metadata-Headers": "traceparent,X-Tenant,x-tenant",
            "traceparent": "00-abc-def-01",
            "X-Tenant": "acme",
        },
    )
    assert r.status_code == 201, r.text
    got = assert_one_of_each(await delivered_headers(config, http, receiver, "allowed"))
    assert got["traceparent"] == "00-abc-def-01" and got["x-tenant"] == "acme"
    assert got["x-hook-token"] == "kt" and got["user-agent"] == "wb-test-agent"
    assert got["host"] == receiver.url.split("/")[2]
    # Everything else on the request is the broker's: the rule refuses each of those names.
    for name in got.keys() - {"traceparent", "x-tenant", "accept", "accept-encoding"}:
        assert name_refusal(name, TOKEN_HEADER) is not None, name


@pytest.mark.parametrize(
    "value",
    [b"caf\xc3\xa9", b"\xe9t\xe9", b"a\x01b", b"a\x7fb", b"tab\tok\x00"],
    ids=["utf8", "latin1", "control", "del", "nul"],
)
async def test_an_unsendable_metadata_value_is_a_400_at_publish(
    http: httpx.AsyncClient, receiver: RawReceiver, value: bytes
) -> None:
    await setup_push(http, receiver.url)
    r = await broadcast(http, "bad-value", {"X-Broker-Metadata-Headers": "X-Meta", "X-Meta": value})
    assert r.status_code == 400, r.text
    assert "X-Meta" in r.text
    assert (await http.get("/channel/c1/message/bad-value")).status_code == 404


async def test_a_message_stored_before_the_rule_is_delivered_with_the_brokers_headers_only(
    config: Config, rt: Runtime, http: httpx.AsyncClient, receiver: RawReceiver
) -> None:
    """Rows written before publishing refused these (an upgrade) go out once, cleaned, and
    never fail their delivery."""
    await setup_push(http, receiver.url)
    r = await broadcast(http, "old", {"X-Broker-Metadata-Headers": "X-Trace", "X-Trace": "t"})
    assert r.status_code == 201, r.text
    stored = {
        "X-Trace": "t",
        "x-broker-signature": "forged",
        "webhook-id": "forged",
        "Host": "elsewhere.example",
        "x-hook-token": "stolen",
        "X-Accent": "caf\xe9",
        "X-Control": "a\x01b",
    }
    async with rt.db.transaction() as tx:
        await tx.conn.execute(
            update(message).where(message.c.message_id == "old").values(headers=stored)
        )
    started = time.monotonic()
    got = assert_one_of_each(await delivered_headers(config, http, receiver, "old"))
    assert time.monotonic() - started < 15
    assert got["x-trace"] == "t"
    assert got["x-broker-signature"] != "forged" and got["x-hook-token"] == "kt"
    assert got["host"] == receiver.url.split("/")[2]
    assert "x-accent" not in got and "x-control" not in got
    assert got["x-broker-metadata-headers"] == "X-Trace"
