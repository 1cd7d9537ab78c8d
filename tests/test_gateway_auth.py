"""[gateway-auth] mode=hmac: the Go original's X-Broker-Signature check (its statuses and
texts), our v2 that also signs method, path and query (one field a line, the body by its
SHA-256), and require-v2. The signatures here are
computed from the Go original's description, not with the broker's own functions."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path

import httpx
import pytest

from app.config import ConfigError, load_config_text
from tests.helpers.processes import BrokerProcess

SECRET = b"gateway-secret-of-the-test"
SECTION = f"[gateway-auth]\nmode=hmac\nhmac-shared-secret={base64.b64encode(SECRET).decode()}\n"


def v1(body: bytes, t: int | None = None) -> str:
    t = int(time.time()) if t is None else t
    mac = hmac.new(SECRET, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def v2(method: str, target: str, body: bytes, t: int | None = None) -> str:
    t = int(time.time()) if t is None else t
    message = f"v2\n{t}\n{method}\n{target}\n{hashlib.sha256(body).hexdigest()}".encode()
    return f"t={t},v2={hmac.new(SECRET, message, hashlib.sha256).hexdigest()}"


FORM = b"token=orders-token&name=Orders"
FORM_TYPE = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def extra_config() -> str:
    return SECTION


async def test_a_go_style_client_passes_and_others_are_told_why(
    client: httpx.AsyncClient,
) -> None:
    put = "/channel/orders"
    assert (await client.get("/_status")).status_code == 200  # exempt
    r = await client.put(put, content=FORM, headers=FORM_TYPE)
    assert (r.status_code, r.text) == (401, "missing X-Broker-Signature header")
    for bad in ("t=1", "v1=abc", "t=x,v1=abc", "t=1,v1=a,v9=b", "t=1;v1=abc", ""):
        headers = {**FORM_TYPE, "X-Broker-Signature": bad}
        r = await client.put(put, content=FORM, headers=headers)
        expected = "missing" if not bad else "malformed"
        assert r.status_code == 401 and r.text.startswith(expected), (bad, r.text)
    stale = v1(FORM, int(time.time()) - 301)
    r = await client.put(put, content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": stale})
    assert (r.status_code, r.text) == (403, "request timestamp outside tolerance window")
    forged = v1(b"token=other&name=Orders")
    r = await client.put(put, content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": forged})
    assert (r.status_code, r.text) == (403, "invalid signature")
    r = await client.put(put, content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": v1(FORM)})
    assert r.status_code == 200, r.text
    assert r.json()["Token"] == "orders-token"  # the route read the body the check read
    r = await client.get(put, headers={"X-Broker-Signature": v1(b"")})
    assert r.status_code == 200
    # Token checks still apply after the signature.
    body = b'{"batch": 1}'
    r = await client.post(
        "/channel/orders/consumer/nobody/pull",
        content=body,
        headers={"X-Broker-Signature": v1(body), "X-Broker-Channel-Token": "orders-token"},
    )
    assert r.status_code == 401 and r.json()["detail"]


async def test_v2_covers_the_method_path_and_query(client: httpx.AsyncClient) -> None:
    signed = v2("PUT", "/channel/orders", FORM)
    r = await client.put(
        "/channel/orders", content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": signed}
    )
    assert r.status_code == 200, r.text
    # The same signature on another path (or with another query) is refused.
    r = await client.put(
        "/channel/other", content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": signed}
    )
    assert (r.status_code, r.text) == (403, "invalid signature")
    listing = v2("GET", "/channels?next=abc", b"")
    assert (
        await client.get("/channels?next=abc", headers={"X-Broker-Signature": listing})
    ).status_code in (200, 400)
    r = await client.get("/channels?next=xyz", headers={"X-Broker-Signature": listing})
    assert r.status_code == 403


@pytest.mark.parametrize("extra_config", [SECTION + "require-v2=true\n"])
async def test_require_v2_refuses_a_replayed_v1(client: httpx.AsyncClient) -> None:
    # A v1 signature covers the body only: the same body signed for one path would pass on
    # another. Under require-v2 it passes nowhere.
    replayed = v1(FORM)
    r = await client.put(
        "/channel/other", content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": replayed}
    )
    assert r.status_code == 403 and r.text.startswith("invalid signature")
    signed = v2("PUT", "/channel/other", FORM)
    r = await client.put(
        "/channel/other", content=FORM, headers={**FORM_TYPE, "X-Broker-Signature": signed}
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ("[gateway-auth]\nmode=oauth\n", ["[gateway-auth] mode", "none", "hmac"]),
        ("[gateway-auth]\nmode=hmac\n", ["[gateway-auth] hmac-shared-secret", "required"]),
        (
            "[gateway-auth]\nmode=hmac\nhmac-shared-secret=not*base64\n",
            ["[gateway-auth] hmac-shared-secret", "base64"],
        ),
        ("[gateway-auth]\nauth-exempt-paths=_status\n", ["auth-exempt-paths", "path"]),
    ],
)
def test_a_bad_gateway_setting_stops_the_start(section: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config_text(section)
    for word in words:
        assert word in str(raised.value)
    assert "not*base64" not in str(raised.value)  # a secret's value is never repeated


def test_the_secret_is_not_in_the_config_repr() -> None:
    config = load_config_text(SECTION)
    assert (
        SECRET not in repr(config).encode()
        and base64.b64encode(SECRET) not in repr(config).encode()
    )


async def test_a_real_process_checks_signatures(rdbms: str, tmp_path: Path) -> None:
    config = tmp_path / "broker.cfg"
    config.write_text(rdbms + SECTION)
    process = BrokerProcess(config)
    process.start()  # waits for /_status: exempt
    try:
        async with httpx.AsyncClient(base_url=process.url) as http:
            r = await http.put("/channel/orders", content=FORM, headers=FORM_TYPE)
            assert (r.status_code, r.text) == (401, "missing X-Broker-Signature header")
            headers = {**FORM_TYPE, "X-Broker-Signature": v1(FORM)}
            assert (
                await http.put("/channel/orders", content=FORM, headers=headers)
            ).status_code == 200
    finally:
        process.stop()
