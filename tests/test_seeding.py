"""Seeding from the [initial-*] sections: applied on every start, idempotent, race-safe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from sqlalchemy import func, select

from app.api.app import create_app
from app.config import Config, load_config_text
from app.runtime import Runtime
from app.services.seeding import SeedError, apply_seed
from app.store.schema import channel, consumer, producer
from tests.helpers.api import create, publish_headers, put_form

SEEDS = """
[initial-channels]
orders=Order events

[initial-channel-tokens]
orders=orders-token

[initial-producers]
shop=The shop

[initial-producer-tokens]
shop=shop-token

[initial-consumers]
mailer=https://mail.example/hook
warehouse=

[mailer]
token=mailer-token
channel=orders

[warehouse]
token=warehouse-token
channel=orders
type=pull
"""


@pytest.fixture
def extra_config() -> str:
    return SEEDS


@asynccontextmanager
async def started(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    """Another broker instance on the same database: start (and seed), serve, stop."""
    runtime = Runtime(config)
    await runtime.start()
    try:
        transport = httpx.ASGITransport(app=create_app(config, runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            yield http
    finally:
        await runtime.stop()


async def row_counts(runtime: Runtime) -> tuple[int, int, int]:
    async with runtime.db.engine.connect() as conn:
        counts = [
            (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            for table in (channel, producer, consumer)
        ]
    return counts[0], counts[1], counts[2]


async def publish_as_shop(client: httpx.AsyncClient, channel_token: str = "orders-token") -> int:
    headers = publish_headers(
        channel_token=channel_token, producer="shop", producer_token="shop-token"
    )
    r = await client.post("/channel/orders/broadcast", content=b"x", headers=headers)
    return r.status_code


async def test_seeded_objects_exist_and_work(client: httpx.AsyncClient, runtime: Runtime) -> None:
    assert (await client.get("/channel/orders")).json()["Name"] == "Order events"
    assert (await client.get("/producer/shop")).json()["Name"] == "The shop"
    mailer = (await client.get("/channel/orders/consumer/mailer")).json()
    assert (mailer["Type"], mailer["CallbackURL"]) == ("push", "https://mail.example/hook")
    warehouse = (await client.get("/channel/orders/consumer/warehouse")).json()
    assert (warehouse["Type"], warehouse["CallbackURL"]) == ("pull", "")
    # The seeded tokens are the ones that authenticate.
    assert await publish_as_shop(client) == 201
    auth = {"X-Broker-Channel-Token": "orders-token", "X-Broker-Consumer-Token": "warehouse-token"}
    r = await client.get("/channel/orders/consumer/warehouse/queued-jobs", headers=auth)
    assert r.status_code == 200, r.text
    assert len(r.json()["Result"]) == 1
    assert await row_counts(runtime) == (1, 1, 2)


async def test_restart_is_idempotent(
    client: httpx.AsyncClient, runtime: Runtime, config: Config
) -> None:
    before = {
        path: (await client.get(path)).headers["Last-Modified"]
        for path in ("/channel/orders", "/producer/shop", "/channel/orders/consumer/mailer")
    }
    for _ in range(2):
        async with started(config) as again:
            for path, last_modified in before.items():
                r = await again.get(path)
                assert r.headers["Last-Modified"] == last_modified, path
    await apply_seed(runtime.db, config.seed, runtime.tokens.digest)
    assert await row_counts(runtime) == (1, 1, 2)


async def test_changed_token_and_name_are_applied(
    client: httpx.AsyncClient, runtime: Runtime, rdbms: str
) -> None:
    changed = (
        SEEDS.replace("orders=orders-token", "orders=rotated-token")
        .replace("shop=The shop", "shop=Shop v2")
        .replace("token=warehouse-token", "token=warehouse-2\nname=Warehouse")
        .replace("warehouse=\n", "warehouse=https://wh.example/in\n")
    )
    async with started(load_config_text(rdbms + changed)) as again:
        assert await publish_as_shop(again, "orders-token") == 403
        assert await publish_as_shop(again, "rotated-token") == 201
        assert (await again.get("/producer/shop")).json()["Name"] == "Shop v2"
        warehouse = (await again.get("/channel/orders/consumer/warehouse")).json()
        assert warehouse["Name"] == "Warehouse"
        assert warehouse["CallbackURL"] == "https://wh.example/in"
    assert await row_counts(runtime) == (1, 1, 2)


async def test_seeding_deletes_nothing_and_resets_seeded_fields(
    client: httpx.AsyncClient, runtime: Runtime, rdbms: str
) -> None:
    await create(client, "/channel/extra", {"token": "extra-token"})
    await create(client, "/channel/orders/consumer/by-api", {"type": "pull"})
    shop = await client.get("/producer/shop")
    r = await put_form(
        client,
        "/producer/shop",
        {"token": "api-token", "name": "Renamed"},
        since=shop.headers["Last-Modified"],
    )
    assert r.status_code == 200
    # A config that no longer lists the mailer.
    fewer = SEEDS.replace("mailer=https://mail.example/hook\n", "").replace(
        "[mailer]\ntoken=mailer-token\nchannel=orders\n", ""
    )
    async with started(load_config_text(rdbms + fewer)) as again:
        assert (await again.get("/channel/extra")).status_code == 200
        assert (await again.get("/channel/orders/consumer/by-api")).status_code == 200
        assert (await again.get("/channel/orders/consumer/mailer")).status_code == 200
        # The seed is the source of truth for what it names.
        assert (await again.get("/producer/shop")).json()["Name"] == "The shop"
        assert await publish_as_shop(again) == 201
    assert await row_counts(runtime) == (2, 1, 3)


async def test_consumer_may_join_a_stored_channel(
    client: httpx.AsyncClient, runtime: Runtime, rdbms: str
) -> None:
    await create(client, "/channel/stored", {"token": "st"})
    text = "[initial-consumers]\nlate=\n[late]\ntoken=lt\nchannel=stored\ntype=pull\n"
    async with started(load_config_text(rdbms + text)) as again:
        assert (await again.get("/channel/stored/consumer/late")).json()["Type"] == "pull"


async def test_unknown_channel_fails_start_naming_the_entry(
    client: httpx.AsyncClient, runtime: Runtime, rdbms: str
) -> None:
    text = SEEDS.replace("channel=orders\ntype=pull", "channel=nowhere\ntype=pull").replace(
        "shop=The shop", "shop=Changed"
    )
    bad = load_config_text(rdbms + text)
    failing = Runtime(bad)
    try:
        with pytest.raises(SeedError) as caught:
            await failing.start()
    finally:
        await failing.stop()
    assert "warehouse" in str(caught.value) and "nowhere" in str(caught.value)
    assert "warehouse-token" not in str(caught.value)
    # The seed is one transaction: the entries before the bad one were not applied either.
    assert (await client.get("/producer/shop")).json()["Name"] == "The shop"


@pytest.fixture
def many_seeds() -> str:
    channels = "\n".join(f"ch{n}=Channel {n}" for n in range(10))
    channel_tokens = "\n".join(f"ch{n}=tok{n}" for n in range(10))
    consumers = "\n".join(f"k{n}=" for n in range(20))
    sections = "\n".join(f"[k{n}]\ntoken=kt{n}\nchannel=ch{n % 10}\ntype=pull\n" for n in range(20))
    return (
        f"[initial-channels]\n{channels}\n[initial-channel-tokens]\n{channel_tokens}\n"
        f"[initial-producers]\np=P\n[initial-producer-tokens]\np=pt\n"
        f"[initial-consumers]\n{consumers}\n{sections}"
    )


async def test_instances_starting_together(rdbms: str, many_seeds: str) -> None:
    """Several instances seeding one empty database at once all start, with no duplicates."""
    config = load_config_text(rdbms + many_seeds)
    runtimes = [Runtime(config) for _ in range(4)]
    try:
        results = await asyncio.gather(*(rt.start() for rt in runtimes), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        assert await row_counts(runtimes[0]) == (10, 1, 20)
    finally:
        for rt in runtimes:
            await rt.stop()
