"""Push that behaves, against real receivers on loopback, on PostgreSQL and SQLite: Standard
Webhooks signatures across a secret rotation, Retry-After, 410 Gone, a hanging endpoint beside
a healthy one, the circuit breaker, and callbacks that point at metadata addresses."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from app.config import Config
from app.dispatch.http import Poster
from tests.helpers.metrics import a_dispatcher_round
from tests.helpers.push import broker, job_of, publish, setup_push, wait_for_status
from tests.helpers.receiver import Receiver, running_receiver
from tests.helpers.waiting import eventually


@pytest.fixture
def extra_config() -> str:
    # No retries at all: a 429 or 410 that counted one would dead-letter the job.
    return (
        "[broker]\nmax-retry=0\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=8\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=2\n"
        "[push]\nmax-in-flight=4\nbreaker-failures=3\nbreaker-cooldown=2\n"
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        yield r


@pytest.fixture
async def http(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    async with broker(config, sweeper=True, dispatcher=True) as client:
        yield client


async def put_consumer(http: httpx.AsyncClient, consumer: str, **form: str) -> dict[str, Any]:
    path = f"/channel/c1/consumer/{consumer}"
    current = await http.get(path)
    headers = {}
    if current.status_code == 200:
        headers["If-Unmodified-Since"] = current.headers["Last-Modified"]
    r = await http.put(path, data={"token": "kt", **form}, headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def received(receiver: Receiver, message_id: str) -> list[dict[str, str]]:
    with receiver.lock:
        return [
            r.headers for r in receiver.requests if r.headers["x-broker-message-id"] == message_id
        ]


async def until(check: Any, within: float = 15.0) -> None:
    await eventually(check, within, 0.02, what="the receiver's requests")


def with_retries(config: Config, max_retry: int) -> Config:
    return dataclasses.replace(
        config, broker=dataclasses.replace(config.broker, max_retry=max_retry)
    )


def verify(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


async def test_standard_webhooks_signatures_across_a_rotation(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    await setup_push(http, receiver.url + "/hook")
    shown = await put_consumer(http, "k1", callbackUrl=receiver.url + "/hook")
    old = shown["SigningSecret"]
    assert old.startswith("whsec_")
    assert "SigningSecret" not in (await http.get("/channel/c1/consumer/k1")).json()

    await publish(http, b'{"n": 1}', "before")
    await until(lambda: received(receiver, "before"))
    before = received(receiver, "before")[0]
    assert before["webhook-id"] and before["webhook-timestamp"]
    assert verify(old, b'{"n": 1}', before)

    rotated = await put_consumer(
        http,
        "k1",
        callbackUrl=receiver.url + "/hook",
        signingSecret="rotate",
        signingSecretOverlap="3",
    )
    put_done = time.monotonic()  # the overlap the PUT set ends at most 3 s after this
    new = rotated["SigningSecret"]
    assert new != old and rotated["SigningSecretRotatedUntil"]
    # (The PUT announced the change: the dispatcher reads the consumer again before it
    # pushes the next job, no pause needed.)
    await publish(http, b'{"n": 2}', "during")
    await until(lambda: received(receiver, "during"))
    during = received(receiver, "during")[0]
    assert len(during["webhook-signature"].split(" ")) == 2
    assert verify(new, b'{"n": 2}', during) and verify(old, b'{"n": 2}', during)

    # Time passes on purpose: the overlap ends (3 s after the PUT).
    await asyncio.sleep(put_done + 3.1 - time.monotonic())
    await publish(http, b'{"n": 3}', "after")
    await until(lambda: received(receiver, "after"))
    after = received(receiver, "after")[0]
    assert verify(new, b'{"n": 3}', after) and not verify(old, b'{"n": 3}', after)
    # The broker's own signature is still there for existing receivers.
    assert after["x-broker-signature"].startswith("t=")

    # A secret of the receiver's choosing is taken as given.
    chosen = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    given = await put_consumer(http, "k1", callbackUrl=receiver.url + "/hook", signingSecret=chosen)
    assert given["SigningSecret"] == chosen


async def test_one_webhook_id_across_the_retries_of_a_job(
    config: Config, receiver: Receiver
) -> None:
    config = with_retries(config, 3)
    receiver.respond = lambda _path, n: (500, 0.0) if n == 1 else (200, 0.0)
    async with broker(config, sweeper=True, dispatcher=True) as http:
        await setup_push(http, receiver.url + "/hook")
        await publish(http, b"x", "retried")
        await wait_for_status(http, "retried", "DELIVERED")
        first, second = received(receiver, "retried")
        assert first["webhook-id"] == second["webhook-id"]
        assert first["x-broker-delivery-attempt"] == "1"
        assert second["x-broker-delivery-attempt"] == "2"


async def test_429_with_retry_after_delays_the_job_and_counts_no_retry(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, n: (429, 0.0, {"Retry-After": "2"}) if n == 1 else (200, 0.0)
    await setup_push(http, receiver.url + "/hook")
    await publish(http, b"slow down", "m1")
    job = await wait_for_status(http, "m1", "DELIVERED")
    assert job["RetryCount"] == 0  # with max-retry=0, a counted failure would have killed it
    with receiver.lock:
        first, second = receiver.requests[0].at, receiver.requests[1].at
    assert 1.8 <= second - first < 4.0, second - first


async def test_410_disables_push_and_a_put_enables_it(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    gone = True
    receiver.respond = lambda _path, _n: (410, 0.0) if gone else (200, 0.0)
    await setup_push(http, receiver.url + "/hook")
    await publish(http, b"one", "m1")
    await until(lambda: receiver.count("/hook") == 1)

    async def disabled() -> dict[str, Any]:
        consumer: dict[str, Any] = (await http.get("/channel/c1/consumer/k1")).json()
        assert consumer["Enabled"] is False, consumer
        return consumer

    consumer = await eventually(disabled, what="the consumer disabled after a 410")
    assert consumer["DisabledAt"]
    assert "410" in consumer["DisabledReason"]
    await publish(http, b"two", "m2")
    await a_dispatcher_round(http)  # it would have claimed m2 (m1 is due too)
    assert receiver.count("/hook") == 1
    assert (await job_of(http, "m1"))["Status"] == "QUEUED"
    assert (await job_of(http, "m2"))["Status"] == "QUEUED"

    gone = False
    enabled = await put_consumer(http, "k1", callbackUrl=receiver.url + "/hook", enabled="true")
    assert enabled["Enabled"] is True
    for message_id in ("m1", "m2"):
        job = await wait_for_status(http, message_id, "DELIVERED")
        assert job["RetryCount"] == 0


async def test_the_breaker_opens_burns_no_retries_and_closes_on_recovery(
    config: Config, receiver: Receiver
) -> None:
    healthy = False
    receiver.respond = lambda _path, _n: (200, 0.0) if healthy else (500, 0.0)
    # Open for 4 s: the jobs come due (a second's backoff) and a round passes well within it.
    config = dataclasses.replace(
        with_retries(config, 10),
        push=dataclasses.replace(config.push, breaker_cooldown_seconds=4),
    )
    async with broker(config, sweeper=True, dispatcher=True) as http:
        await setup_push(http, receiver.url + "/hook")
        for n in range(3):
            await publish(http, b"x", f"m{n}")
        await until(lambda: receiver.count("/hook") >= 3)

        async def opened() -> dict[str, Any]:
            state: dict[str, Any] = (await http.get("/channel/c1/consumer/k1")).json()["Breaker"]
            assert state["State"] == "open", state
            return state

        state = await eventually(opened, what="the breaker open")
        assert state["OpenUntil"], state
        # The jobs are due again after a second's backoff, but the breaker holds them.
        seen = receiver.count("/hook")

        async def all_due() -> bool:
            for n in range(3):
                job = await job_of(http, f"m{n}")
                assert job["Status"] == "QUEUED", job
                due = datetime.fromisoformat(str(job["EarliestNextAttemptAt"]))
                assert due <= datetime.now(UTC), job
            return True

        await eventually(all_due, what="the three jobs due again")
        await a_dispatcher_round(http)
        assert receiver.count("/hook") == seen
        state = (await http.get("/channel/c1/consumer/k1")).json()["Breaker"]
        assert state["State"] == "open", state  # the round saw it open, not its probe's turn
        retries = [(await job_of(http, f"m{n}"))["RetryCount"] for n in range(3)]

        healthy = True
        for n in range(3):
            await wait_for_status(http, f"m{n}", "DELIVERED")
        after = [(await job_of(http, f"m{n}"))["RetryCount"] for n in range(3)]
        assert after == retries  # the open breaker burned no retries
        assert receiver.count("/hook") == seen + 3  # one probe, then the other two
        state = (await http.get("/channel/c1/consumer/k1")).json()["Breaker"]
        assert state == {"State": "closed", "ConsecutiveFailures": 0, "OpenUntil": None}


async def test_a_hanging_endpoint_holds_only_its_own_window(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    """max-in-flight=4 of max-workers=8: the hanging consumer never holds more than its four,
    so the healthy one gets the other four at once beside it. The healthy receiver holds each
    delivery until four are open together: were the hanging consumer holding more slots, the
    fourth would never come."""
    release = threading.Event()
    lock = threading.Lock()
    open_now = {"/ok": 0, "/hang": 0}
    most = {"/ok": 0, "/hang": 0}

    def respond(path: str, _n: int) -> tuple[int, float]:
        with lock:
            open_now[path] += 1
            most[path] = max(most[path], open_now[path])
        if path == "/hang":
            return (200, 30.0)  # far past the 2 s timeout: the slot is held until then
        release.wait(30)  # held until the test has seen four open at once
        with lock:
            open_now[path] -= 1
        return (200, 0.0)

    receiver.respond = respond
    # The hanging consumer first, with jobs enough to fill every slot it could take.
    await setup_push(http, receiver.url + "/hang")
    for n in range(8):
        await publish(http, b"x", f"h{n}")
    await eventually(lambda: most["/hang"] >= 4, timeout=20, what="four hanging pushes open")
    r = await http.put(
        "/channel/c1/consumer/ok", data={"token": "ot", "callbackUrl": receiver.url + "/ok"}
    )
    assert r.status_code == 200, r.text
    for n in range(8):  # eight jobs for each consumer
        await publish(http, b"x", f"m{n}")
    try:
        await eventually(
            lambda: most["/ok"] >= 4, timeout=20, what="four healthy pushes open at once"
        )
        # Neither went past its four: the hanging one held no slot beyond its window.
        assert most == {"/ok": 4, "/hang": 4}, most
    finally:
        release.set()
    # Released, the healthy consumer's window moves on to its other four jobs.
    await eventually(lambda: receiver.count("/ok") >= 8, timeout=20, what="eight healthy pushes")


# The hanging deliveries time out after 20 s here, so "not when they time out" is told apart
# by a deadline far from it, not by a fraction of a second.
@pytest.mark.parametrize(
    "extra_config",
    [
        "[broker]\nmax-retry=0\nmax-workers=8\n[consumer-connection]\nconnection-timeout-in-seconds=20\n"
    ],
    ids=["20s-timeout"],
)
async def test_endpoints_that_hang_in_most_slots_leave_the_rest_to_the_others(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    """A hanging consumer allowed 7 of the 8 slots: the one left is fewer than the free slots
    a claim waits for (half of this window), and is claimed for the healthy consumer all the
    same, at most CLAIM_WAIT later (not when the hanging deliveries time out)."""

    def respond(path: str, _n: int) -> tuple[int, float]:
        return (200, 30.0) if path == "/hang" else (200, 0.1)

    receiver.respond = respond
    assert (await http.put("/channel/c1", data={"token": "ct"})).status_code == 200
    assert (await http.put("/producer/p1", data={"token": "pt"})).status_code == 200
    r = await http.put(
        "/channel/c1/consumer/hang",
        data={"token": "ht", "callbackUrl": receiver.url + "/hang", "maxInFlight": "7"},
    )
    assert r.status_code == 200, r.text
    for n in range(7):
        await publish(http, b"x", f"h{n}")
    await until(lambda: receiver.count("/hang") >= 7)  # 7 of the 8 slots held
    r = await http.put(
        "/channel/c1/consumer/k1", data={"token": "kt", "callbackUrl": receiver.url + "/ok"}
    )
    assert r.status_code == 200, r.text
    # (k1's creation was announced: the dispatcher knows it at its next round.)
    await publish(http, b"x", "m0")
    # In the slot left, well before the hanging deliveries' 20 s timeout, which waiting for
    # enough free slots would have waited for.
    await until(lambda: receiver.count("/ok") >= 1, within=10)
    assert receiver.count("/hang") == 7
    for n in range(1, 10):
        await publish(http, b"x", f"m{n}")
    await until(lambda: receiver.count("/ok") >= 10, within=30)


async def test_callbacks_to_metadata_addresses_are_refused(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (await http.put("/channel/c1", data={"token": "ct"})).status_code == 200
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/hook"):
        r = await http.put("/channel/c1/consumer/k1", data={"token": "kt", "callbackUrl": url})
        assert r.status_code == 400 and "link-local" in r.json()["detail"], r.text

    # A name that resolves there is refused when a delivery would go out (the resolver's
    # answer stands in for a DNS record pointing at the metadata service).
    poster = Poster(2, 4)
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo

    async def resolve(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "metadata.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 80))]
        return await real(host, *args, **kwargs)

    monkeypatch.setattr(loop, "getaddrinfo", resolve)
    try:
        answer = await poster.post("http://metadata.example/latest", b"x", {})
    finally:
        await poster.close()
    assert answer.status is None and "link-local" in (answer.error or "")


async def test_a_rate_limit_is_never_exceeded(http: httpx.AsyncClient, receiver: Receiver) -> None:
    """rateLimit=5: twenty deliveries take about four seconds (a second's burst of five, then
    five a second), whatever else the dispatcher could do."""
    await setup_push(http, receiver.url + "/hook")
    # (The PUT announced the change: the dispatcher reads the limit before its next push.)
    await put_consumer(http, "k1", callbackUrl=receiver.url + "/hook", rateLimit="5")
    for n in range(20):
        await publish(http, b"x", f"r{n}")
    await until(lambda: receiver.count("/hook") == 20, within=20)
    with receiver.lock:
        times = sorted(r.at for r in receiver.requests)
    # Any window of one second holds at most the burst plus one second's tokens.
    for i, start in enumerate(times):
        within_a_second = sum(1 for t in times[i:] if t - start < 1.0)
        assert within_a_second <= 10, (i, within_a_second)
    assert times[-1] - times[0] >= 2.5, times[-1] - times[0]


async def test_push_outcomes_are_counted_in_metrics(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond = lambda _path, n: (
        (429, 0.0, {"Retry-After": "1"}) if n == 1 else (500, 0.0) if n == 2 else (200, 0.0)
    )
    await setup_push(http, receiver.url + "/hook")
    await publish(http, b"a", "a")
    await until(lambda: receiver.count("/hook") >= 2)
    await publish(http, b"b", "b")
    await until(lambda: receiver.count("/hook") >= 3, within=20)
    await wait_for_status(http, "b", "DELIVERED")
    text = (await http.get("/metrics")).text
    counted = {
        outcome: float(line.rsplit(" ", 1)[1])
        for outcome in ("delivered", "deferred", "failed")
        for line in text.splitlines()
        if line.startswith(f'webhook_broker_push_deliveries_total{{outcome="{outcome}"}}')
    }
    assert counted["deferred"] == 1 and counted["failed"] == 1 and counted["delivered"] >= 1
    assert "webhook_broker_push_delivery_duration_seconds_count" in text


async def test_a_push_consumer_with_max_ack_pending_is_still_pushed(
    http: httpx.AsyncClient, receiver: Receiver
) -> None:
    """maxAckPending is a pull setting: the dispatcher's own window limits a push consumer, and
    a maxAckPending left on it (or set by a PUT) must not stop its deliveries."""
    await setup_push(http, receiver.url + "/hook")
    await put_consumer(http, "k1", callbackUrl=receiver.url + "/hook", maxAckPending="1")
    for n in range(3):
        await publish(http, b"x", f"capped{n}")
    for n in range(3):
        await wait_for_status(http, f"capped{n}", "DELIVERED")
