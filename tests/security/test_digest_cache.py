"""Digests of recently seen channel and producer tokens are kept (app/services/tokens.py,
issue 40): the same digest as hashing anew, bounded, never for long tokens, nothing shown, and a
rotated token is refused however recently its digest was kept."""

from __future__ import annotations

import httpx
import pytest

from app.domain.tokens import TokenDigest
from app.runtime import Runtime
from app.services.tokens import RECENT, RECENT_LENGTH, RecentDigests
from tests.helpers.api import publish_headers, put_form

ADMIN = "admin-c0a1"
SEEDS = f"""
[http]
admin-token={ADMIN}

[initial-channels]
orders=Orders
[initial-channel-tokens]
orders=orders-chan-old
[initial-producers]
shop=Shop
[initial-producer-tokens]
shop=shop-prod-old
"""


@pytest.fixture
def extra_config() -> str:
    return SEEDS


def test_a_kept_digest_is_the_digest() -> None:
    kept, fresh = RecentDigests(b"k1"), TokenDigest(b"k1")
    long = "t" * (RECENT_LENGTH + 1)
    for token in ("a", "a", "b", "", long, long):
        assert kept(token) == fresh(token)
    assert kept.optional(None) is None
    info = kept._recent.cache_info()
    assert (info.hits, info.currsize, info.maxsize) == (1, 3, RECENT)  # the long one not kept
    assert RecentDigests(b"k2")("a") != kept("a")  # one cache per key
    assert "k1" not in repr(kept) and "a" not in repr(kept).replace("redacted", "")


async def publish(client: httpx.AsyncClient, channel_token: str, producer_token: str) -> int:
    headers = publish_headers(
        channel_token=channel_token, producer="shop", producer_token=producer_token
    )
    r = await client.post("/channel/orders/broadcast", content=b"{}", headers=headers)
    return r.status_code


async def test_a_rotated_token_is_refused_though_its_digest_was_kept(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    assert isinstance(runtime.tokens.digest, RecentDigests)
    assert await publish(client, "orders-chan-old", "shop-prod-old") == 201
    assert await publish(client, "orders-chan-old", "shop-prod-old") == 201
    assert runtime.tokens.digest._recent.cache_info().hits >= 2  # kept, and used

    admin = {"Authorization": f"Bearer {ADMIN}"}
    for path, token in (("/channel/orders", "orders-chan-new"), ("/producer/shop", "shop-new")):
        since = (await client.get(path, headers=admin)).headers["Last-Modified"]
        r = await put_form(client, path, {"token": token}, since=since, headers=admin)
        assert r.status_code == 200, r.text

    assert await publish(client, "orders-chan-old", "shop-new") == 403
    assert await publish(client, "orders-chan-new", "shop-prod-old") == 403
    assert await publish(client, "orders-chan-new", "shop-new") == 201
