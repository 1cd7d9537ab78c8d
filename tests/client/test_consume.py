"""consume() against a real broker process: the bounded buffer, refills at the threshold,
stop and drain, a broker restart, a paused broker, a deleted consumer, iteration."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from webhook_broker_client import ConsumerGone, HeartbeatError, Job

from tests.helpers.processes import Setup, job_state
from tests.helpers.waiting import eventually


async def pending_batches(setup: Setup) -> list[int]:
    """Records the `batch` of every pull the consumer's HTTP client sends."""
    batches: list[int] = []

    async def hook(request: httpx.Request) -> None:
        if request.url.path.endswith("/pull"):
            batches.append(json.loads(request.content)["batch"])

    setup.broker.http.event_hooks["request"].append(hook)
    return batches


async def settle(setup: Setup, within: float = 20.0) -> None:
    """Until the consumer has no job due or in flight."""

    async def settled() -> bool:
        info = await setup.consumer.info()
        assert info.pending == 0 and info.ack_pending == 0, info
        return True

    await eventually(settled, within, what="the consumer has no job due or in flight")


async def test_consume_never_holds_more_than_max_messages(setup: Setup) -> None:
    batches = await pending_batches(setup)
    holding = 0
    most = 0
    handled: list[str] = []
    all_done = asyncio.Event()

    async def handle(job: Job) -> None:
        nonlocal holding, most
        holding += 1
        most = max(most, holding)
        await asyncio.sleep(0.005)
        handled.append(job.text)
        holding -= 1
        if len(handled) == 300:
            all_done.set()

    errors: list[Exception] = []
    context = setup.consumer.consume(
        handle, max_messages=20, concurrency=50, error_callback=errors.append
    )
    # New messages keep arriving while it consumes.
    for start in range(0, 300, 50):
        await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(start, start + 50)])
        await eventually(lambda: len(handled) > start, 30, what="handling under way")  # noqa: B023
    await asyncio.wait_for(all_done.wait(), 60)
    await context.stop()
    assert sorted(handled) == sorted(f"m{n}" for n in range(300))
    assert most <= 20  # 50 workers, but never more than max_messages jobs at once
    assert errors == []
    assert len(batches) >= 300 // 20  # refilled over and over
    assert max(batches) <= 20
    await settle(setup)


@pytest.mark.parametrize(("threshold", "small_refills"), [(1, False), (10, True)])
async def test_the_threshold_decides_when_to_refill(
    setup: Setup, threshold: int, small_refills: bool
) -> None:
    batches = await pending_batches(setup)
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(60)])
    done = asyncio.Event()
    count = 0

    async def handle(job: Job) -> None:
        nonlocal count
        count += 1
        if count == 60:
            done.set()

    context = setup.consumer.consume(
        handle, max_messages=10, threshold_messages=threshold, concurrency=1
    )
    await asyncio.wait_for(done.wait(), 30)
    await context.stop()
    # threshold 1: a pull only once nothing is pending, each for the whole 10;
    # threshold 10: a pull as soon as one job is done, for what is missing.
    assert batches[0] == 10
    assert any(b < 10 for b in batches) is small_refills
    await settle(setup)


async def test_drain_finishes_the_buffer_and_hands_back_the_rest(setup: Setup) -> None:
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(60)])
    started = asyncio.Event()
    handled: list[str] = []

    async def handle(job: Job) -> None:
        started.set()
        await asyncio.sleep(0.05)
        handled.append(job.id)

    context = setup.consumer.consume(handle, max_messages=20, concurrency=2)
    await asyncio.wait_for(started.wait(), 10)
    await context.drain()
    assert context.closed and len(handled) >= 20  # everything buffered was handled
    info = await setup.consumer.info()
    assert info.ack_pending == 0  # nothing left in flight
    assert info.pending == 60 - len(handled)
    for job_id in handled:
        assert (await job_state(setup, job_id))["Status"] == "DELIVERED"
    queued = await setup.broker.http.get(
        f"{setup.consumer.path}/queued-jobs?limit=100", headers=setup.consumer.headers
    )
    ids = [j["ID"] for j in queued.json()["Result"]]
    assert len(ids) == info.pending
    for job_id in ids:  # never given to the handler: no retry counted
        assert (await job_state(setup, job_id))["RetryCount"] == 0


async def test_stop_hands_back_what_no_handler_started(setup: Setup) -> None:
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(50)])
    started = asyncio.Event()
    release = asyncio.Event()
    handled: list[str] = []

    async def handle(job: Job) -> None:
        started.set()
        await release.wait()
        handled.append(job.id)

    context = setup.consumer.consume(handle, max_messages=30, concurrency=1)
    await asyncio.wait_for(started.wait(), 10)

    async def in_flight(count: int) -> bool:
        info = await setup.consumer.info()
        assert info.ack_pending == count, info
        return True

    await eventually(lambda: in_flight(30), what="the buffer filled behind the running handler")
    stopping = asyncio.create_task(context.stop())
    await eventually(lambda: in_flight(1), what="the 29 buffered jobs handed back")
    release.set()  # the running handler finishes (and its job is acked)
    await asyncio.wait_for(stopping, 20)
    assert len(handled) == 1
    info = await setup.consumer.info()
    assert (info.pending, info.ack_pending) == (49, 0)
    assert (await job_state(setup, handled[0]))["Status"] == "DELIVERED"


@pytest.mark.parametrize("consumer_settings", [{"ackWait": "2"}])
async def test_a_broker_restart_loses_nothing(private_setup: Setup) -> None:
    setup = private_setup
    handled: set[str] = set()
    errors: list[Exception] = []

    async def handle(job: Job) -> None:
        await asyncio.sleep(0.002)
        handled.add(job.text)

    context = setup.consumer.consume(
        handle, max_messages=50, concurrency=10, expires=4, error_callback=errors.append
    )
    await setup.broker.publish_many(setup.channel, [f"a{n}" for n in range(150)])
    await eventually(lambda: len(handled) >= 50, 20, what="50 handled")
    seen = len(errors)
    await asyncio.to_thread(setup.process.stop)  # SIGTERM: the broker's streams end
    await eventually(lambda: len(errors) > seen, 20, what="consume retried against a closed port")
    await asyncio.to_thread(setup.process.start)
    await setup.broker.publish_many(setup.channel, [f"b{n}" for n in range(150)])
    expected = {f"a{n}" for n in range(150)} | {f"b{n}" for n in range(150)}
    await eventually(lambda: expected <= handled, 60, what="every message handled")
    assert not context.closed
    assert errors  # it said what went wrong while the broker was away
    await context.stop()
    await settle(setup)


async def test_a_paused_broker_raises_the_heartbeat_error(private_setup: Setup) -> None:
    setup = private_setup
    heartbeat = 0.5
    failed = asyncio.Event()
    errors: list[Exception] = []

    def on_error(error: Exception) -> None:
        errors.append(error)
        if isinstance(error, HeartbeatError):
            failed.set()

    context = setup.consumer.consume(
        lambda job: None, expires=5, idle_heartbeat=heartbeat, error_callback=on_error
    )
    await eventually(lambda: context.heartbeats >= 3, 15, what="three heartbeats heard")
    assert errors == []  # an open pull beating raises nothing
    setup.process.pause()
    paused = time.monotonic()
    try:
        await asyncio.wait_for(failed.wait(), 10)
        silent = time.monotonic() - paused
    finally:
        setup.process.resume()
    # The silence since the last line it heard (at most one heartbeat before the pause).
    assert silent <= 2 * heartbeat + 0.5, silent
    await setup.broker.publish(setup.channel, "after")  # the pull issued again takes it
    got: list[Job] = []

    await context.stop()
    context = setup.consumer.consume(got.append, expires=5)
    await eventually(lambda: got, 20, what="the job published after the pause")
    await context.stop()
    assert got[0].text == "after"


async def test_a_deleted_consumer_ends_consume(setup: Setup) -> None:
    errors: list[Exception] = []
    batches = await pending_batches(setup)
    context = setup.consumer.consume(lambda job: None, expires=10, error_callback=errors.append)
    await eventually(lambda: batches, what="consume sent its pull")
    await setup.broker.delete_consumer(setup.channel, "billing")
    with pytest.raises(ConsumerGone):
        await asyncio.wait_for(context.wait(), 15)
    assert context.closed
    assert any(isinstance(e, ConsumerGone) for e in errors)


async def test_iterating_a_consume(setup: Setup) -> None:
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(30)])
    seen: list[str] = []
    context = setup.consumer.consume(max_messages=10)
    async for job in context:
        seen.append(job.text)
        await job.ack()
        if len(seen) == 30:
            break
    await context.stop()
    assert sorted(seen) == sorted(f"m{n}" for n in range(30))
    await settle(setup)


async def test_a_failing_handler_naks_and_reports(setup: Setup) -> None:
    await setup.broker.publish(setup.channel, "boom")
    errors: list[Exception] = []
    reported = asyncio.Event()

    def fail(job: Job) -> Any:
        raise RuntimeError(f"cannot handle {job.text}")

    def on_error(error: Exception) -> None:
        errors.append(error)
        if len(errors) >= 2:
            reported.set()

    context = setup.consumer.consume(fail, error_callback=on_error)
    # Naked without a delay, the job is due at once (as JetStream's -NAK): the handler sees it
    # again, which it could not had the nak not handed it back.
    await asyncio.wait_for(reported.wait(), 10)
    await context.stop()
    assert all(isinstance(error, RuntimeError) for error in errors)
    assert str(errors[0]) == str(errors[1]) == "cannot handle boom"


@pytest.mark.parametrize(
    "consumer_settings", [{"priorityGroups": "jobs", "priorityPolicy": "pinned_client"}]
)
async def test_consume_keeps_its_pin_and_learns_when_it_is_lost(setup: Setup) -> None:
    pins: list[tuple[str, str]] = []
    changed = asyncio.Event()
    handled: list[str] = []

    def on_pinned(pin: str) -> None:
        pins.append(("pinned", pin))
        changed.set()

    def on_unpinned(pin: str) -> None:
        pins.append(("unpinned", pin))
        changed.set()

    context = setup.consumer.consume(
        lambda job: handled.append(job.text),
        group="jobs",
        expires=10,
        on_pinned=on_pinned,
        on_unpinned=on_unpinned,
    )
    await setup.broker.publish(setup.channel, "first")
    await asyncio.wait_for(changed.wait(), 10)
    ((kind, pin),) = pins
    assert kind == "pinned" and setup.consumer.pin_id == pin
    changed.clear()
    unpinned = await setup.broker.http.post(
        f"{setup.consumer.path}/unpin", json={"group": "jobs"}, headers=setup.consumer.headers
    )
    assert unpinned.status_code == 200 and unpinned.json()["Unpinned"] is True
    await setup.broker.publish(setup.channel, "second")
    await eventually(
        lambda: len(pins) >= 3 and len(handled) >= 2, 20, what="a new pin and two handled"
    )
    await context.stop()
    # Its pull named the pin that was gone: told so (423), it pulled without it and was
    # pinned afresh, and took the second job under the new pin.
    assert pins[1] == ("unpinned", pin)
    assert pins[2][0] == "pinned" and pins[2][1] != pin
    assert handled == ["first", "second"]


async def test_a_buffer_larger_than_one_stream_takes_several(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("webhook_broker_client.consume.MAX_STREAM_BATCH", 10)
    batches = await pending_batches(setup)
    await setup.broker.publish_many(setup.channel, [f"m{n}" for n in range(25)])
    got: list[Job] = []
    context = setup.consumer.consume(got.append, max_messages=25, concurrency=25)
    await eventually(lambda: len(got) >= 25, 20, what="25 jobs in one consume")
    await context.stop()
    assert batches[:3] == [10, 10, 5]
    await settle(setup)
