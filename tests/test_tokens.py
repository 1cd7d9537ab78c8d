"""Secrets: the admin token guards changes; no GET response and no log line carries a token."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from app.api.app import create_app
from app.config import Config, LogConfig, load_config_text
from app.logging import NOISY, setup_logging
from app.runtime import Runtime
from devtools.pg import free_port
from tests.helpers.api import FORM_TYPE, publish_headers, put_form

ADMIN = "admin-7f3c0e"
SEEDED = {
    "orders": "chan-tok-91b2",
    "shop": "prod-tok-44aa",
    "mailer": "cons-tok-mail-5d",
    "warehouse": "cons-tok-wh-8e",
}
SEEDS = f"""
[http]
admin-token={ADMIN}

[initial-channels]
orders=Orders

[initial-channel-tokens]
orders={SEEDED["orders"]}

[initial-producers]
shop=Shop

[initial-producer-tokens]
shop={SEEDED["shop"]}

[initial-consumers]
mailer=https://mail.example/hook
warehouse=

[mailer]
token={SEEDED["mailer"]}
channel=orders

[warehouse]
token={SEEDED["warehouse"]}
channel=orders
type=pull
"""
BEARER = {"Authorization": f"Bearer {ADMIN}"}
WAREHOUSE_AUTH = {
    "X-Broker-Channel-Token": SEEDED["orders"],
    "X-Broker-Consumer-Token": SEEDED["warehouse"],
}
# Loggers of the broker and the servers around it; SQLAlchemy's own logging is covered below.
BROKER_LOGGERS = ("app", "webhook_broker", "uvicorn", "fastapi", "httpx")


@pytest.fixture
def extra_config() -> str:
    return SEEDS


def shop_headers(**extra: str) -> dict[str, str]:
    return publish_headers(
        channel_token=SEEDED["orders"], producer="shop", producer_token=SEEDED["shop"], **extra
    )


# The admin token


ADMIN_CHANGES = [
    ("PUT", "/producer/p-new", {"token": "x"}, 200),
    ("PUT", "/channel/c-new", {"token": "x"}, 200),
    ("PUT", "/channel/orders/consumer/k-new", {"type": "pull"}, 200),
]


@pytest.mark.parametrize(("method", "path", "fields", "ok"), ADMIN_CHANGES)
async def test_changes_need_the_admin_token(
    client: httpx.AsyncClient, method: str, path: str, fields: dict[str, str], ok: int
) -> None:
    for headers, status in [
        ({}, 401),
        ({"Authorization": ""}, 401),
        ({"Authorization": f"Basic {ADMIN}"}, 401),
        ({"Authorization": ADMIN}, 401),
        ({"Authorization": "Bearer "}, 403),
        ({"Authorization": "Bearer wrong"}, 403),
        ({"Authorization": f"Bearer {ADMIN}x"}, 403),
    ]:
        r = await put_form(client, path, fields, headers=headers)
        assert r.status_code == status, (headers, r.text)
        assert ADMIN not in r.text
    # Refused before the body is read: no form is no 415 without the token.
    r = await client.put(path, json=fields)
    assert r.status_code == 401
    assert (await client.get(path, headers=BEARER)).status_code == 404
    r = await put_form(client, path, fields, headers={"Authorization": f"bearer {ADMIN}"})
    assert r.status_code == ok, r.text
    assert (await client.get(path, headers=BEARER)).status_code == 200


async def test_updates_of_seeded_objects_need_the_admin_token(client: httpx.AsyncClient) -> None:
    current = (await client.get("/channel/orders", headers=BEARER)).headers["Last-Modified"]
    r = await put_form(client, "/channel/orders", {"name": "Hijacked"}, since=current)
    assert r.status_code == 401
    r = await put_form(
        client,
        "/channel/orders",
        {"name": "Hijacked"},
        since=current,
        headers={"Authorization": "Bearer nope"},
    )
    assert r.status_code == 403
    assert (await client.get("/channel/orders", headers=BEARER)).json()["Name"] == "Orders"


async def test_consumer_delete_needs_the_admin_token(client: httpx.AsyncClient) -> None:
    path = "/channel/orders/consumer/warehouse"
    since = {
        "If-Unmodified-Since": (await client.get(path, headers=BEARER)).headers["Last-Modified"]
    }
    assert (await client.delete(path, headers=since)).status_code == 401
    r = await client.delete(path, headers={**since, "Authorization": "Bearer nope"})
    assert r.status_code == 403
    assert (await client.get(path, headers=BEARER)).status_code == 200
    assert (await client.delete(path, headers={**since, **BEARER})).status_code == 204
    assert (await client.get(path, headers=BEARER)).status_code == 404


async def test_publishing_needs_no_admin_token_and_a_channel_token_reads_its_channel(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/channel/orders/broadcast", content=b"x", headers=shop_headers())
    assert r.status_code == 201, r.text
    channel = {"X-Broker-Channel-Token": SEEDED["orders"]}
    for path in ("/channel/orders", "/channel/orders/consumers", "/channel/orders/messages"):
        assert (await client.get(path, headers=channel)).status_code == 200, path
    # Lists over every channel need the reader or admin token.
    for path in ("/channels", "/producers"):
        assert (await client.get(path, headers=channel)).status_code == 401, path
        assert (await client.get(path, headers=BEARER)).status_code == 200, path


# No token in any GET response or log line


def find_secrets(text: str, secrets: Iterator[str] | list[str]) -> list[str]:
    return [secret for secret in secrets if secret in text]


async def test_no_get_response_or_log_line_holds_a_token(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    for name in BROKER_LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    secrets = [*SEEDED.values(), ADMIN, "api-made-token-3e9", "api-consumer-token-b1"]

    # Changes through the API, with tokens in forms and headers.
    r = await put_form(client, "/producer/api-made", {"token": secrets[-2]}, headers=BEARER)
    assert r.status_code == 200
    r = await put_form(
        client,
        "/channel/orders/consumer/api-consumer",
        {"token": secrets[-1], "type": "pull"},
        headers=BEARER,
    )
    assert r.status_code == 200
    # Messages, one of which names credential headers as its metadata headers.
    for n in range(3):
        r = await client.post(
            "/channel/orders/broadcast",
            content=f"payload {n}".encode(),
            headers=shop_headers(
                X_Broker_Message_ID=f"m{n}",
                X_Broker_Metadata_Headers=(
                    "X-Broker-Channel-Token, X-Broker-Producer-Token, Authorization, X-Trace"
                ),
                X_Trace="trace-1",
                Authorization=f"Bearer {ADMIN}",
            ),
        )
        assert r.status_code == 201, r.text
    # Refused requests, whose error bodies must not echo what was sent or expected.
    r = await client.post(
        "/channel/orders/broadcast",
        content=b"x",
        headers=shop_headers(X_Broker_Producer_Token=SEEDED["mailer"]),
    )
    assert r.status_code == 403
    bad_consumer = {**WAREHOUSE_AUTH, "X-Broker-Consumer-Token": SEEDED["mailer"]}
    r = await client.get("/channel/orders/consumer/warehouse/queued-jobs", headers=bad_consumer)
    assert r.status_code == 403
    assert find_secrets(r.text, secrets) == []

    # Every GET, following every link the list endpoints offer.
    gets: list[tuple[str, dict[str, str]]] = [
        ("/_status", {}),
        ("/channels", BEARER),
        ("/producers", BEARER),
        ("/channel/orders/messages", BEARER),
        ("/channel/orders/messages-status", BEARER),
        ("/channel/orders/consumers", BEARER),
        ("/channel/orders/consumer/warehouse/queued-jobs", WAREHOUSE_AUTH),
        ("/channel/orders/consumer/warehouse/dlq", WAREHOUSE_AUTH),
    ]
    seen: list[httpx.Response] = []
    index = 0
    while index < len(gets):
        path, headers = gets[index]
        index += 1
        r = await client.get(path, headers=headers)
        assert r.status_code == 200, (path, r.text)
        seen.append(r)
        body = r.json()
        for link in body.get("Result", []) if isinstance(body, dict) else []:
            if isinstance(link, str):
                gets.append((link, BEARER))
            elif isinstance(link, dict) and "ID" in link:
                job_path = f"/channel/orders/consumer/warehouse/job/{link['ID']}"
                gets.append((job_path, WAREHOUSE_AUTH))
    paths = [path for path, _ in gets]
    assert "/channel/orders/message/m2" in paths
    assert "/channel/orders/consumer/api-consumer" in paths
    assert "/producer/api-made" in paths
    assert any("/job/" in path for path in paths)

    message = next(r for r in seen if r.request.url.path == "/channel/orders/message/m0").json()
    assert message["Headers"] == {"X-Trace": "trace-1"}
    for r in seen:
        text = r.text + "".join(f"{k}: {v}\n" for k, v in r.headers.items())
        assert find_secrets(text, secrets) == [], r.request.url
    assert caplog.records, "the scenario should have produced log records to scan"
    assert find_secrets(caplog.text, secrets) == []


NOISY_LOGGERS = (*NOISY, *BROKER_LOGGERS)


@contextmanager
def production_logging(config: Config, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The logging of a real process (app.logging.setup_logging), captured by caplog."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    setup_logging(config.log)
    root.addHandler(caplog.handler)
    try:
        yield
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
async def test_production_logging_keeps_tokens_out(
    config: Config, caplog: pytest.LogCaptureFixture, level: str
) -> None:
    # A fresh runtime seeds (INSERTs with tokens) under the process's own logging setup;
    # SQLAlchemy would log those parameters if its loggers were left at INFO or DEBUG.
    config = dataclasses.replace(config, log=LogConfig(filename="", level=level))
    runtime = Runtime(config)
    with production_logging(config, caplog):
        await runtime.start()
        await exercise(runtime, config)
        logging.getLogger("app").info("scenario done")
    assert "scenario done" in caplog.text
    assert find_secrets(caplog.text, [*SEEDED.values(), ADMIN, "fresh-token-77"]) == []


async def exercise(runtime: Runtime, config: Config) -> None:
    try:
        transport = httpx.ASGITransport(app=create_app(config, runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            r = await http.post("/channel/orders/broadcast", content=b"x", headers=shop_headers())
            assert r.status_code == 201
            r = await http.put(
                "/producer/p2",
                content=b"token=fresh-token-77",
                headers={"Content-Type": FORM_TYPE, **BEARER},
            )
            assert r.status_code == 200
    finally:
        await runtime.stop()


def test_config_errors_do_not_echo_tokens() -> None:
    # (An unknown consumer type only skips that consumer now; a bad ack-wait stops the start.)
    text = SEEDS.replace("type=pull", "type=pull\nack-wait=soon")
    with pytest.raises(Exception) as caught:
        load_config_text(text)
    assert find_secrets(str(caught.value), [*SEEDED.values(), ADMIN]) == []


# /_status: health and database reachability, never configuration secrets


async def test_status_reports_a_reachable_database(
    client: httpx.AsyncClient, config: Config, backend: str
) -> None:
    r = await client.get("/_status")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "database": {"dialect": backend, "status": "ok", "schema": "current"},
    }
    assert config.database.connection_url not in r.text
    assert find_secrets(r.text, [*SEEDED.values(), ADMIN]) == []


@pytest.mark.parametrize(
    "rdbms_text",
    [
        "[rdbms]\ndialect=sqlite\nconnection-url=/nonexistent-dir/x/broker.sqlite3\n",
        "[rdbms]\ndialect=postgresql\n"
        "connection-url=postgresql://broker:db-pass-0c1d@127.0.0.1:{port}/broker\n",
    ],
    ids=["sqlite", "postgresql"],
)
async def test_status_reports_an_unreachable_database(rdbms_text: str) -> None:
    config = load_config_text(rdbms_text.format(port=free_port()) + SEEDS)
    runtime = Runtime(config)  # never started: nothing to seed into
    try:
        transport = httpx.ASGITransport(app=create_app(config, runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            r = await http.get("/_status")
    finally:
        await runtime.stop()
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "degraded"
    assert body["database"]["status"].startswith("unreachable")
    assert find_secrets(r.text, ["db-pass-0c1d", "/nonexistent-dir", *SEEDED.values(), ADMIN]) == []
