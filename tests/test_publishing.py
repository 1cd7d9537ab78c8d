"""Publishing (broadcast) and reading messages, on PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import func, select

from app.runtime import Runtime
from app.store.schema import job, message
from tests.helpers.api import create, publish_headers, setup_channel

MAX_SIZE = 1024


@pytest.fixture
def extra_config() -> str:
    return f"[broker]\nmax-message-size-bytes={MAX_SIZE}\n"


@pytest.fixture
async def channel(client: httpx.AsyncClient) -> str:
    await setup_channel(client, consumers=3)
    return "/channel/c1"


async def count_rows(runtime: Runtime) -> tuple[int, int, Counter[str]]:
    """Messages, jobs and jobs by status, read straight from the database."""
    async with runtime.db.engine.connect() as conn:
        messages = (await conn.execute(select(func.count()).select_from(message))).scalar_one()
        jobs = (await conn.execute(select(func.count()).select_from(job))).scalar_one()
        statuses = Counter(
            {
                status: int(n)
                for status, n in await conn.execute(
                    select(job.c.status, func.count()).group_by(job.c.status)
                )
            }
        )
    return int(messages), int(jobs), statuses


async def publish(
    client: httpx.AsyncClient, body: bytes = b"hello", path: str = "/channel/c1", **headers: str
) -> httpx.Response:
    return await client.post(f"{path}/broadcast", content=body, headers=publish_headers(**headers))


async def test_publish_stores_message_and_one_job_per_consumer(
    client: httpx.AsyncClient, channel: str, runtime: Runtime
) -> None:
    r = await publish(
        client,
        b'{"order": 7}',
        Content_Type="application/json",
        X_Broker_Message_Priority="5",
        X_Broker_Message_ID="order-7",
        X_Broker_Metadata_Headers="X-Trace, X-Tenant, X-Absent",
        X_Trace="abc",
        X_Tenant="acme",
        X_Unlisted="nope",
    )
    assert r.status_code == 201, r.text
    assert r.headers["Location"] == f"{channel}/message/order-7"
    # The message and its jobs were committed before the 201.
    assert (await count_rows(runtime))[:2] == (1, 3)

    r = await client.get(r.headers["Location"])
    assert r.status_code == 200
    body = r.json()
    assert body["ID"] == "order-7"
    assert body["Payload"] == '{"order": 7}'
    assert body["ContentType"] == "application/json"
    assert body["Priority"] == 5
    assert body["ProducedBy"] == "p1"
    assert body["Headers"] == {"X-Trace": "abc", "X-Tenant": "acme"}
    assert body["ReceivedAt"]
    jobs = body["Jobs"]
    assert sorted(j["ListenerName"] for j in jobs) == ["k0", "k1", "k2"]
    assert {j["Status"] for j in jobs} == {"QUEUED"}
    assert {j["ConsumerURL"] for j in jobs} == {f"{channel}/consumer/k{n}" for n in range(3)}


async def test_defaults_generated_id_and_octet_stream(
    client: httpx.AsyncClient, channel: str
) -> None:
    r = await client.post(
        f"{channel}/broadcast",
        content=b"\x00\xffraw",
        headers={**publish_headers(), "Content-Type": ""},
    )
    assert r.status_code == 201, r.text
    location = r.headers["Location"]
    assert location.startswith(f"{channel}/message/")
    body = (await client.get(location)).json()
    assert len(body["ID"]) >= 16
    assert body["ContentType"] == "application/octet-stream"
    assert body["Priority"] == 0
    assert body["Headers"] == {}
    # Bytes that are not UTF-8 come back base64-encoded, flagged, and intact.
    assert body["PayloadEncoding"] == "base64"
    assert base64.b64decode(body["Payload"]) == b"\x00\xffraw"
    second = await publish(client)
    assert second.headers["Location"] != location


async def test_channel_without_consumers_stores_the_message(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    await setup_channel(client, consumers=0)
    r = await publish(client, X_Broker_Message_ID="lonely")
    assert r.status_code == 201
    assert (await count_rows(runtime))[:2] == (1, 0)
    assert (await client.get(r.headers["Location"])).json()["Jobs"] == []


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"channel_token": "wrong"}, 403),
        ({"channel_token": ""}, 403),
        ({"producer": "ghost"}, 401),
        ({"producer": ""}, 401),
        ({"producer_token": "wrong"}, 403),
        ({"producer_token": ""}, 403),
    ],
)
async def test_credentials(
    client: httpx.AsyncClient,
    channel: str,
    runtime: Runtime,
    headers: dict[str, str],
    status: int,
) -> None:
    r = await client.post(f"{channel}/broadcast", content=b"x", headers=publish_headers(**headers))
    assert r.status_code == status, r.text
    assert (await count_rows(runtime))[:2] == (0, 0)


async def test_missing_credential_headers(client: httpx.AsyncClient, channel: str) -> None:
    r = await client.post(f"{channel}/broadcast", content=b"x")
    assert r.status_code == 403
    only_channel = {"X-Broker-Channel-Token": "ct"}
    r = await client.post(f"{channel}/broadcast", content=b"x", headers=only_channel)
    assert r.status_code == 401
    r = await client.post(
        f"{channel}/broadcast", content=b"x", headers={**only_channel, "X-Broker-Producer-ID": "p1"}
    )
    assert r.status_code == 403


async def test_unknown_channel_is_404(client: httpx.AsyncClient, channel: str) -> None:
    r = await publish(client, path="/channel/nope")
    assert r.status_code == 404
    assert (await client.get("/channel/nope/messages")).status_code == 404
    assert (await client.get("/channel/nope/messages-status")).status_code == 404
    assert (await client.get("/channel/nope/message/x")).status_code == 404


async def test_another_channels_token_is_403(client: httpx.AsyncClient, channel: str) -> None:
    await create(client, "/channel/c2", {"token": "other"})
    assert (await publish(client, path="/channel/c2")).status_code == 403
    assert (await publish(client, path="/channel/c2", channel_token="other")).status_code == 201


async def test_empty_body_is_400(client: httpx.AsyncClient, channel: str, runtime: Runtime) -> None:
    r = await publish(client, b"")
    assert r.status_code == 400
    assert (await count_rows(runtime))[:2] == (0, 0)


async def test_size_limit(client: httpx.AsyncClient, channel: str, runtime: Runtime) -> None:
    assert (await publish(client, b"a" * MAX_SIZE)).status_code == 201
    r = await publish(client, b"a" * (MAX_SIZE + 1))
    assert r.status_code == 413

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"b" * (MAX_SIZE // 2)

    # No Content-Length (chunked): the body itself is measured.
    r = await client.post(f"{channel}/broadcast", content=chunks(), headers=publish_headers())
    assert r.status_code == 413
    assert (await count_rows(runtime))[:2] == (1, 3)


@pytest.mark.parametrize(
    "priority", ["high", "1.5", "", " 7 ", "-3", "2147483648", "-2147483648", "-2147483649"]
)
async def test_priority(client: httpx.AsyncClient, channel: str, priority: str) -> None:
    r = await publish(client, X_Broker_Message_Priority=priority)
    if priority.strip() in ("", "7", "-3"):
        assert r.status_code == 201, r.text
        expected = abs(int(priority.strip() or 0))  # as the Go original: -3 is stored as 3
        assert (await client.get(r.headers["Location"])).json()["Priority"] == expected
    else:
        assert r.status_code == 400, r.text


async def test_priority_bounds_are_accepted(client: httpx.AsyncClient, channel: str) -> None:
    for priority in (2**31 - 1, -(2**31 - 1)):
        r = await publish(client, X_Broker_Message_Priority=str(priority))
        assert r.status_code == 201, r.text
        assert (await client.get(r.headers["Location"])).json()["Priority"] == abs(priority)


async def test_repeated_message_id_is_409_and_changes_nothing(
    client: httpx.AsyncClient, channel: str, runtime: Runtime
) -> None:
    first = await publish(client, b"first", X_Broker_Message_ID="m-1", Content_Type="text/plain")
    assert first.status_code == 201
    before = (await client.get(first.headers["Location"])).json()
    again = await publish(
        client, b"second", X_Broker_Message_ID="m-1", X_Broker_Message_Priority="9"
    )
    assert again.status_code == 409
    assert (await count_rows(runtime))[:2] == (1, 3)
    assert (await client.get(first.headers["Location"])).json() == before
    # The id is an idempotency key per channel: another channel may reuse it.
    await create(client, "/channel/c2", {"token": "ct"})
    assert (await publish(client, path="/channel/c2", X_Broker_Message_ID="m-1")).status_code == 201


async def test_message_id_rules(client: httpx.AsyncClient, channel: str) -> None:
    assert (await publish(client, X_Broker_Message_ID="x" * 256)).status_code == 400
    assert (await publish(client, X_Broker_Message_ID="x" * 255)).status_code == 201
    # Ids with URL-special characters still lead back to the message.
    for odd in ("a/b", "with space", "q?x=1#frag", "%41"):
        r = await publish(client, X_Broker_Message_ID=odd)
        assert r.status_code == 201, r.text
        got = await client.get(r.headers["Location"])
        assert got.status_code == 200, (odd, r.headers["Location"])
        assert got.json()["ID"] == odd


async def test_content_type_and_metadata_header_rules(
    client: httpx.AsyncClient, channel: str
) -> None:
    r = await publish(client, Content_Type="text/" + "x" * 300)
    assert r.status_code == 400
    r = await publish(client, X_Broker_Metadata_Headers="Bad Header")
    assert r.status_code == 400
    r = await publish(client, X_Broker_Metadata_Headers=",,")
    assert r.status_code == 201


async def test_message_of_another_channel_is_404(client: httpx.AsyncClient, channel: str) -> None:
    await create(client, "/channel/c2", {"token": "ct"})
    r = await publish(client, X_Broker_Message_ID="only-in-c1")
    assert r.status_code == 201
    assert (await client.get("/channel/c2/message/only-in-c1")).status_code == 404
    assert (await client.get(f"{channel}/message/never-sent")).status_code == 404


async def test_message_list_pages(client: httpx.AsyncClient, channel: str) -> None:
    ids = [f"m{n:02d}" for n in range(30)]
    for id_ in ids:
        assert (await publish(client, X_Broker_Message_ID=id_)).status_code == 201
    first = (await client.get(f"{channel}/messages")).json()
    assert first["Result"] == [f"{channel}/message/{id_}" for id_ in ids[:25]]
    assert "previous" not in first["Pages"]
    r = await client.get(first["Pages"]["next"])
    assert r.status_code == 200
    second = r.json()
    assert second["Result"] == [f"{channel}/message/{id_}" for id_ in ids[25:]]
    assert "next" not in second["Pages"]
    back = (await client.get(second["Pages"]["previous"])).json()
    assert back["Result"] == first["Result"]


@pytest.mark.parametrize("cursor", ["bm90LWEtbnVtYmVy", "OTk5OTk5OTk5OTk5OTk5OTk5OTk5", "%%%"])
async def test_message_list_refuses_forged_cursors(
    client: httpx.AsyncClient, channel: str, cursor: str
) -> None:
    # "not-a-number" and 999999999999999999999 (beyond BIGINT), base64-encoded.
    r = await client.get(f"{channel}/messages", params={"next": cursor})
    assert r.status_code == 400, r.text
    r = await client.get(f"{channel}/messages", params={"previous": cursor})
    assert r.status_code == 400, r.text


async def test_messages_status_counts_jobs(client: httpx.AsyncClient, channel: str) -> None:
    r = await client.get(f"{channel}/messages-status")
    assert r.status_code == 200
    assert r.json()["Counts"]["QUEUED"]["Count"] == 0
    for n in range(4):
        await publish(client, X_Broker_Message_ID=f"s{n}")
    counts = (await client.get(f"{channel}/messages-status")).json()["Counts"]
    assert {status: entry["Count"] for status, entry in counts.items()} == {
        "QUEUED": 12,
        "INFLIGHT": 0,
        "DELIVERED": 0,
        "DEAD": 0,
        "SCHEDULED": 0,
    }


async def test_concurrent_publishers_with_repeated_ids(
    client: httpx.AsyncClient, runtime: Runtime
) -> None:
    """20 publishers send 1,000 messages reusing 100 ids to a channel with 5 consumers."""
    await setup_channel(client, consumers=5)
    publishers, total, distinct = 20, 1000, 100
    statuses: Counter[int] = Counter()

    async def publisher(n: int) -> None:
        for i in range(n, total, publishers):
            r = await publish(
                client, f"payload {i}".encode(), X_Broker_Message_ID=f"id-{i % distinct}"
            )
            statuses[r.status_code] += 1

    await asyncio.gather(*(publisher(n) for n in range(publishers)))
    assert statuses == Counter({201: distinct, 409: total - distinct})
    messages, jobs, by_status = await count_rows(runtime)
    assert (messages, jobs) == (distinct, distinct * 5)
    assert by_status == Counter({"QUEUED": distinct * 5})
    async with runtime.db.engine.connect() as conn:
        per_message = (
            await conn.execute(select(job.c.message_pk, func.count()).group_by(job.c.message_pk))
        ).all()
    assert sorted(n for _, n in per_message) == [5] * distinct


FAIL_JOB_INSERTS = {
    "sqlite": [
        "CREATE TRIGGER refuse_jobs BEFORE INSERT ON job BEGIN SELECT RAISE(ABORT, 'no jobs'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'no jobs'; END $$",
        "CREATE TRIGGER refuse_jobs BEFORE INSERT ON job "
        "FOR EACH ROW EXECUTE FUNCTION refuse_jobs()",
    ],
}
ALLOW_JOB_INSERTS = {
    "sqlite": ["DROP TRIGGER refuse_jobs"],
    "postgresql": ["DROP TRIGGER refuse_jobs ON job", "DROP FUNCTION refuse_jobs()"],
}


async def test_message_and_jobs_commit_together_or_not_at_all(
    client: httpx.AsyncClient, channel: str, runtime: Runtime, backend: str
) -> None:
    """When the fan-out fails inside the database, the message is not stored either."""
    async with runtime.db.engine.begin() as conn:
        for statement in FAIL_JOB_INSERTS[backend]:
            await conn.exec_driver_sql(statement)
    with pytest.raises(Exception, match="no jobs"):
        # The ASGI transport re-raises the application's error instead of a 500.
        await publish(client, X_Broker_Message_ID="atomic")
    assert (await count_rows(runtime))[:2] == (0, 0)
    assert (await client.get(f"{channel}/message/atomic")).status_code == 404
    async with runtime.db.engine.begin() as conn:
        for statement in ALLOW_JOB_INSERTS[backend]:
            await conn.exec_driver_sql(statement)
    # The id was not used up by the failed attempt.
    assert (await publish(client, X_Broker_Message_ID="atomic")).status_code == 201
    assert (await count_rows(runtime))[:2] == (1, 3)


async def test_deleting_a_consumer_removes_its_jobs(
    client: httpx.AsyncClient, channel: str, runtime: Runtime
) -> None:
    r = await publish(client, X_Broker_Message_ID="m")
    assert r.status_code == 201
    consumer = await client.get(f"{channel}/consumer/k1")
    r = await client.delete(
        f"{channel}/consumer/k1",
        headers={"If-Unmodified-Since": consumer.headers["Last-Modified"]},
    )
    assert r.status_code == 204
    jobs = (await client.get(f"{channel}/message/m")).json()["Jobs"]
    assert sorted(j["ListenerName"] for j in jobs) == ["k0", "k2"]
    assert (await count_rows(runtime))[:2] == (1, 2)
    # Later messages fan out to the remaining consumers only.
    assert (await publish(client, X_Broker_Message_ID="n")).status_code == 201
    assert (await count_rows(runtime))[:2] == (2, 4)
