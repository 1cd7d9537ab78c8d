"""Who may change and read what over HTTP: the admin and reader tokens, the channel token for
a channel's own reads, the loopback default, and tokens stored as keyed hashes."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from app.config import ConfigError, load_config_text
from app.domain.access import Role, read_role, role_of, stands_in
from app.domain.errors import Forbidden
from app.domain.tokens import TokenDigest, is_digest
from app.logging import warn_open_access
from app.runtime import Runtime
from devtools.pg import free_port
from tests.helpers.api import publish_headers, put_form
from tests.helpers.cli import clean_env, run

ADMIN = "admin-b41d"
READER = "reader-77e0"
CHANNEL_TOKEN = "orders-chan-3a"
SEEDS = f"""
[http]
admin-token={ADMIN}
reader-token={READER}

[initial-channels]
orders=Orders
audit=Audit
[initial-channel-tokens]
orders={CHANNEL_TOKEN}
audit=audit-chan-9c
[initial-producers]
shop=Shop
[initial-producer-tokens]
shop=shop-prod-5f
[initial-consumers]
billing=
[billing]
token=billing-cons-1d
channel=orders
type=pull
"""
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_READER = {"Authorization": f"Bearer {READER}"}
AS_CHANNEL = {"X-Broker-Channel-Token": CHANNEL_TOKEN}
PUBLISH = publish_headers(
    channel_token=CHANNEL_TOKEN, producer="shop", producer_token="shop-prod-5f"
)
CHANNEL_READS = (
    "/channel/orders",
    "/channel/orders/consumers",
    "/channel/orders/consumer/billing",
    "/channel/orders/messages",
    "/channel/orders/message/m1",
    "/channel/orders/messages-status",
    "/channel/orders/scheduled-messages",
)
GLOBAL_READS = ("/channels", "/producers", "/producer/shop", "/job-status", "/dlq-status")


@pytest.fixture
def extra_config() -> str:
    return SEEDS


async def published(client: httpx.AsyncClient) -> None:
    headers = {**PUBLISH, "X-Broker-Message-ID": "m1", "Content-Type": "application/json"}
    r = await client.post("/channel/orders/broadcast", content=b'{"card": "4111"}', headers=headers)
    assert r.status_code == 201, r.text


# -- the finding: anonymous changes and reads ----------------------------------------------------


async def test_anonymous_changes_are_refused_with_an_admin_token(client: httpx.AsyncClient) -> None:
    """The exploit: If-Unmodified-Since from an anonymous GET, then a PUT of a new token."""
    path = "/channel/orders/consumer/billing"
    assert (await client.get(path)).status_code == 401
    since = (await client.get(path, headers=AS_ADMIN)).headers["Last-Modified"]
    r = await put_form(client, path, {"token": "attacker", "type": "pull"}, since=since)
    assert r.status_code == 401
    r = await client.delete(path, headers={"If-Unmodified-Since": since})
    assert r.status_code == 401
    # The reader token reads but never changes.
    r = await put_form(client, path, {"token": "x", "type": "pull"}, since=since, headers=AS_READER)
    assert r.status_code == 403 and "reads only" in r.json()["detail"]
    r = await client.delete(path, headers={"If-Unmodified-Since": since, **AS_READER})
    assert r.status_code == 403
    assert (await client.get(path, headers=AS_ADMIN)).headers["Last-Modified"] == since


async def test_anonymous_message_reads_are_refused(client: httpx.AsyncClient) -> None:
    await published(client)
    for path in (*CHANNEL_READS, *GLOBAL_READS):
        r = await client.get(path)
        assert r.status_code == 401, (path, r.text)
        assert "card" not in r.text and "m1" not in r.text
        r = await client.get(path, headers={"Authorization": "Bearer guess"})
        assert r.status_code == 403, path


async def test_the_reader_token_reads_everything(client: httpx.AsyncClient) -> None:
    await published(client)
    for path in (*CHANNEL_READS, *GLOBAL_READS):
        for who in (AS_READER, AS_ADMIN):
            r = await client.get(path, headers=who)
            assert r.status_code == 200, (path, r.text)
    body = (await client.get("/channel/orders/message/m1", headers=AS_READER)).json()
    assert "4111" in str(body)


async def test_a_channel_token_reads_its_own_channel_only(client: httpx.AsyncClient) -> None:
    await published(client)
    for path in CHANNEL_READS:
        assert (await client.get(path, headers=AS_CHANNEL)).status_code == 200, path
        other = path.replace("/channel/orders", "/channel/audit")
        if "billing" in other or "m1" in other:
            continue
        r = await client.get(other, headers=AS_CHANNEL)
        assert r.status_code == 403, other
    for path in GLOBAL_READS:
        assert (await client.get(path, headers=AS_CHANNEL)).status_code == 401, path
    r = await client.get("/channel/nowhere/messages", headers=AS_CHANNEL)
    assert r.status_code == 404


async def test_the_admin_token_stands_in_for_a_consumers_tokens_on_its_dlq(
    client: httpx.AsyncClient,
) -> None:
    dlq = "/channel/orders/consumer/billing/dlq"
    assert (await client.get(dlq)).status_code == 403  # no channel token
    assert (await client.get(dlq, headers=AS_READER)).status_code == 200
    assert (await client.get(dlq, headers=AS_ADMIN)).status_code == 200
    # Purging is a change: the reader token does not stand in for it.
    assert (await client.delete(dlq, headers=AS_READER)).status_code == 403
    r = await client.delete(dlq, headers=AS_ADMIN)
    assert r.status_code == 200 and r.json() == {"deletedCount": 0}


# -- anonymous-reads and the listener ------------------------------------------------------------


async def test_anonymous_reads_restores_open_reads_and_is_warned(
    rdbms: str, caplog: pytest.LogCaptureFixture
) -> None:
    from app.api.app import create_app

    config = load_config_text(rdbms + SEEDS.replace("[http]\n", "[http]\nanonymous-reads=true\n"))
    runtime = Runtime(config)
    await runtime.start()
    try:
        transport = httpx.ASGITransport(app=create_app(config, runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            await published(http)
            for path in (*CHANNEL_READS, *GLOBAL_READS):
                assert (await http.get(path)).status_code == 200, path
            r = await put_form(http, "/channel/orders", {"name": "x"})
            assert r.status_code == 401  # changes still need the admin token
    finally:
        await runtime.stop()
    with caplog.at_level(logging.WARNING, logger="app.config"):
        warn_open_access(config)
    assert "anonymous-reads=true" in caplog.text


def test_a_listener_that_is_not_loopback_needs_an_admin_token() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text("[http]\nlistener=:8080\n")
    assert "[http] admin-token" in str(caught.value)
    assert "allow-anonymous-admin" in str(caught.value)
    for listener in ("127.0.0.1:8080", "[::1]:8080", "localhost:8080", "127.0.0.5:1"):
        load_config_text(f"[http]\nlistener={listener}\n")
    assert load_config_text("").http.loopback
    load_config_text(f"[http]\nlistener=0.0.0.0:8080\nadmin-token={ADMIN}\n")


def test_allow_anonymous_admin_starts_open_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config_text("[http]\nlistener=0.0.0.0:8080\nallow-anonymous-admin=true\n")
    with caplog.at_level(logging.WARNING, logger="app.config"):
        warn_open_access(config)
    assert "allow-anonymous-admin=true" in caplog.text
    assert "0.0.0.0:8080" in caplog.text


def test_a_real_serve_on_every_interface_without_a_token_does_not_start(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    env = clean_env(tmp_path / "home", WEBHOOK_BROKER__HTTP__LISTENER=f":{free_port()}")
    result = run(["serve"], tmp_path, env)
    assert result.returncode == 2, result.stderr
    assert "[http] admin-token" in result.stderr
    assert not (tmp_path / "webhook-broker.sqlite3").exists()


async def test_the_reader_token_changes_nothing_even_without_an_admin_token(rdbms: str) -> None:
    """A loopback broker with only a reader token: changes are open to anonymous local callers
    (no admin token), but never to the reader token, which is read-only by definition."""
    from app.api.app import create_app

    config = load_config_text(rdbms + f"[http]\nreader-token={READER}\n")
    runtime = Runtime(config)
    await runtime.start()
    try:
        transport = httpx.ASGITransport(app=create_app(config, runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            r = await put_form(http, "/channel/c", {"token": "t"}, headers=AS_READER)
            assert r.status_code == 403 and "reads only" in r.json()["detail"]
            assert (await put_form(http, "/channel/c", {"token": "t"})).status_code == 200
            assert (await http.get("/channels")).status_code == 401
            assert (await http.get("/channels", headers=AS_READER)).status_code == 200
    finally:
        await runtime.stop()


@pytest.mark.parametrize("field", ["id", "token"])
async def test_ids_and_tokens_with_control_characters_are_refused(
    client: httpx.AsyncClient, field: str
) -> None:
    """They travel in push headers, where a line break would end the header."""
    path = "/channel/orders/consumer/" + ("bad%0Aid" if field == "id" else "fine")
    fields = {"type": "pull", **({"token": "t\r\nX-Injected: 1"} if field == "token" else {})}
    r = await put_form(client, path, fields, headers=AS_ADMIN)
    assert r.status_code == 400 and "control characters" in r.json()["detail"], r.text


# -- tokens at rest ------------------------------------------------------------------------------


async def test_channel_and_producer_tokens_are_stored_as_keyed_hashes(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    r = await put_form(client, "/channel/fresh", {"token": "fresh-chan-tok"}, headers=AS_ADMIN)
    assert r.status_code == 200 and r.json()["Token"] == "fresh-chan-tok"  # answered once
    r = await client.get("/channel/fresh", headers=AS_ADMIN)
    assert "Token" not in r.json()
    async with runtime.db.transaction() as tx:
        rows = [
            *(await tx.conn.exec_driver_sql("SELECT id, token FROM channel")).all(),
            *(await tx.conn.exec_driver_sql("SELECT id, token FROM producer")).all(),
        ]
    stored = {str(row.id): str(row.token) for row in rows}
    assert set(stored) == {"orders", "audit", "fresh", "shop"}
    for id_, token in stored.items():
        assert is_digest(token), id_
    for plain in (CHANNEL_TOKEN, "audit-chan-9c", "fresh-chan-tok", "shop-prod-5f"):
        assert plain not in str(rows)
    # The tokens still work where they are asked for.
    r = await client.get("/channel/fresh", headers={"X-Broker-Channel-Token": "fresh-chan-tok"})
    assert r.status_code == 200
    await published(client)


def test_a_token_digest_is_keyed() -> None:
    one, two = TokenDigest(b"k1"), TokenDigest(b"k2")
    assert one("t") == one("t") != two("t")
    assert is_digest(one("t")) and not is_digest("t")
    assert one.optional(None) is None
    assert "k1" not in repr(one)


async def test_plain_tokens_of_an_older_database_are_hashed_at_start(rdbms: str) -> None:
    """Rows written before tokens were hashed keep working: the first start hashes them."""
    config = load_config_text(rdbms + "[http]\ntoken-hash-key=from-config\n")
    runtime = Runtime(config)
    await runtime.start()
    async with runtime.db.transaction() as tx:
        await tx.conn.exec_driver_sql(
            "INSERT INTO channel (id, name, token, created_at, updated_at) "
            "VALUES ('old', 'Old', 'old-plain-token', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
        )
    await runtime.stop()
    runtime = Runtime(config)
    await runtime.start()
    try:
        async with runtime.db.transaction() as tx:
            stored = (
                await tx.conn.exec_driver_sql("SELECT token FROM channel WHERE id = 'old'")
            ).scalar_one()
        assert stored == TokenDigest(b"from-config")("old-plain-token")
        assert await runtime.admin.channel_token_matches(
            "old", runtime.tokens.digest("old-plain-token")
        )
    finally:
        await runtime.stop()


# -- the pure rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("authorization", "role"),
    [
        (None, Role.NONE),
        ("", Role.NONE),
        (f"Basic {ADMIN}", Role.NONE),
        (ADMIN, Role.NONE),
        (f"Bearer {ADMIN}", Role.ADMIN),
        (f"bearer {ADMIN} ", Role.ADMIN),
        (f"Bearer {READER}", Role.READER),
        ("Bearer ", Forbidden),
        (f"Bearer {ADMIN}x", Forbidden),
    ],
)
def test_role_of(authorization: str | None, role: object) -> None:
    if role is Forbidden:
        with pytest.raises(Forbidden):
            role_of(authorization, ADMIN, READER)
    else:
        assert role_of(authorization, ADMIN, READER) is role


def test_read_role_and_stands_in() -> None:
    assert read_role(None, ADMIN, READER, guarded=False) is Role.NONE
    assert read_role(None, ADMIN, READER, guarded=True) is None
    assert read_role(f"Bearer {READER}", ADMIN, READER, guarded=True) is Role.READER
    # No reader token configured: an empty bearer never matches it.
    with pytest.raises(Forbidden):
        role_of("Bearer ", ADMIN, "")
    assert stands_in(f"Bearer {ADMIN}", ADMIN, READER, read=False)
    assert stands_in(f"Bearer {READER}", ADMIN, READER, read=True)
    assert not stands_in(f"Bearer {READER}", ADMIN, READER, read=False)
    assert not stands_in("Bearer proxy-token", ADMIN, READER, read=True)
    assert not stands_in("Bearer ", "", "", read=True)
