"""Gateway HMAC: the middleware reads at most the body's cap (a real process, a raw socket), a
non-ASCII or malformed signature is a 403 and never a 500, the v2 signed text is unambiguous,
and [gateway-auth] reject-replays refuses a v2 signature seen before. Signatures here are made
from the documented format (app/api/gateway.py), not with the broker's functions."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.api.gateway import ReplayCache
from tests.helpers.bounded import (
    GIB,
    KERNEL_SLACK,
    READ_SLACK,
    send_endless,
    server_reads,
    start_process,
)
from tests.helpers.processes import BrokerProcess

SECRET = b"the gateway's shared secret"
SECTION = f"[gateway-auth]\nmode=hmac\nhmac-shared-secret={base64.b64encode(SECRET).decode()}\n"
BODY_CAP = 131_072
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def v2(method: str, target: str, body: bytes, t: int | None = None) -> str:
    """The documented v2: one field a line, the body by its SHA-256."""
    t = int(time.time()) if t is None else t
    text = f"v2\n{t}\n{method}\n{target}\n{hashlib.sha256(body).hexdigest()}".encode()
    return f"t={t},v2={hmac.new(SECRET, text, hashlib.sha256).hexdigest()}"


@pytest.fixture(scope="module")
def gateway(
    sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("gateway")
    process = start_process(sqlite_template, workdir, f"max-body-bytes={BODY_CAP}\n" + SECTION)
    try:
        yield process
    finally:
        process.stop()


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_the_middleware_reads_at_most_the_cap(gateway: BrokerProcess, signed: bool) -> None:
    # A signature of the right shape and time: the body is read (to the cap) to check it.
    header = f"\r\nX-Broker-Signature: {v2('PUT', '/channel/big', b'')}" if signed else ""
    head = (
        f"PUT /channel/big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/x-www-form-urlencoded{header}"
    )
    before = server_reads(gateway)
    outcome = send_endless(gateway.port, head, chunked=True, give_up=64 << 20)
    read = server_reads(gateway) - before
    if signed:
        assert outcome.status == 413 and str(BODY_CAP) in outcome.text, outcome
        assert outcome.sent <= BODY_CAP + KERNEL_SLACK, outcome
        assert read <= BODY_CAP + READ_SLACK, read
    else:
        assert (outcome.status, outcome.text) == (401, "missing X-Broker-Signature header")
        assert outcome.sent <= KERNEL_SLACK and read <= READ_SLACK, (outcome, read)
    assert outcome.sent < GIB


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture
def extra_config() -> str:
    return SECTION


@pytest.mark.parametrize(
    "signature",
    [
        "t=1700000000,v1=\u00e9".encode(),
        f"t={int(time.time())},v2=".encode() + "\u0100".encode() * 32,
        f"t={int(time.time())},v1=".encode() + b"\xff" * 64,
        f"t={int(time.time())},v2={'z' * 64}".encode(),
        f"t={int(time.time())},v1=abc".encode(),
        "t=\u0661\u0662,v1=ab".encode(),  # Arabic-Indic digits: isdigit() says yes
    ],
    ids=["non-ascii-v1", "non-ascii-v2", "latin-1", "not-hex", "short", "non-ascii-time"],
)
async def test_a_non_ascii_or_malformed_signature_is_403(
    client: httpx.AsyncClient, signature: bytes
) -> None:
    headers = [(b"content-type", FORM["Content-Type"].encode()), (b"x-broker-signature", signature)]
    r = await client.put("/channel/orders", content=b"token=x", headers=headers)
    assert (r.status_code, r.text) == (403, "invalid signature")


async def test_the_v2_text_is_unambiguous(client: httpx.AsyncClient) -> None:
    # Under "<t>.<METHOD>.<target>.<body>" these two requests had one text: the path's tail
    # could move into the body.
    first_body = b"x.token=orders-token&name=Orders"
    signed = v2("PUT", "/channel/orders", first_body)
    r = await client.put(
        "/channel/orders", content=first_body, headers={**FORM, "X-Broker-Signature": signed}
    )
    assert r.text != "invalid signature" and r.status_code != 403, r.text
    r = await client.put(
        "/channel/orders.x",
        content=b"token=orders-token&name=Orders",
        headers={**FORM, "X-Broker-Signature": signed},
    )
    assert (r.status_code, r.text) == (403, "invalid signature")


@pytest.mark.parametrize(
    ("extra_config", "second"),
    [(SECTION + "reject-replays=true\n", 403), (SECTION, 200)],
    ids=["reject-replays", "default"],
)
async def test_a_replayed_v2_signature(client: httpx.AsyncClient, second: int) -> None:
    signed = {"X-Broker-Signature": v2("GET", "/channels", b"")}
    assert (await client.get("/channels", headers=signed)).status_code == 200
    r = await client.get("/channels", headers=signed)
    assert r.status_code == second, r.text
    if second == 403:
        assert r.text.startswith("invalid signature")
        # Another request (another text) is not a replay.
        fresh = {"X-Broker-Signature": v2("GET", "/channels?n=1", b"")}
        assert (await client.get("/channels?n=1", headers=fresh)).status_code == 200
        # A v1 signature (what a replay of "t=..,v1=..,v2=.." could be cut down to) is
        # refused: the cache keeps v2 signatures, so reject-replays implies require-v2.
        t = str(int(time.time()))
        v1 = hmac.new(SECRET, f"{t}.".encode(), hashlib.sha256).hexdigest()
        r = await client.get("/channels?n=2", headers={"X-Broker-Signature": f"t={t},v1={v1}"})
        assert r.status_code == 403, r.text


def test_the_replay_cache_is_bounded_and_forgets_what_has_gone_stale() -> None:
    cache = ReplayCache(capacity=2)
    assert cache.admit("a", until=100.0, now=0.0) is True
    assert cache.admit("a", until=100.0, now=1.0) is False
    assert cache.admit("b", until=50.0, now=1.0) is True
    # Full of live signatures: it refuses rather than forget one it must still refuse.
    assert cache.admit("c", until=100.0, now=2.0) is None
    # Once "b"'s timestamp has left the window (it would be refused as stale), its place frees.
    assert cache.admit("c", until=100.0, now=51.0) is True
    assert len(cache) == 2
