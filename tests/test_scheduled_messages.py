"""X-Broker-Scheduled-For against a real broker process: the message and its jobs are stored at
once, due at the schedule; not claimable or listed before it, and handed to a waiting pull
within a second after it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.config import load_config_text
from tests.helpers.processes import BrokerProcess, Setup, channel_with_consumer
from tests.helpers.receiver import running_receiver
from tests.helpers.waiting import eventually


def publisher(made: Setup) -> dict[str, str]:
    """The headers a publisher of the test's channel sends."""
    return {
        "X-Broker-Channel-Token": "orders-token",
        "X-Broker-Producer-ID": "shop",
        "X-Broker-Producer-Token": str(made.broker.producer_token),
    }


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@pytest.fixture
def process(rdbms: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    config = tmp_path / "broker.cfg"
    # No minimum delay, so a test need not wait two minutes for its message.
    config.write_text(rdbms + "[scheduler]\nmin-schedule-delay-minutes=0\n")
    broker = BrokerProcess(config)
    broker.start()
    yield broker
    broker.stop()


async def test_a_scheduled_message_falls_due_at_its_time(process: BrokerProcess) -> None:
    async with channel_with_consumer(process, {}) as made:
        broker, billing, orders = made.broker, made.consumer, made.channel
        headers = {**publisher(made), "X-Broker-Message-ID": "later"}
        due = datetime.now(UTC) + timedelta(seconds=3)
        r = await broker.http.post(
            f"/channel/{orders}/broadcast",
            content=b"in three seconds",
            headers={**headers, "X-Broker-Scheduled-For": rfc3339(due)},
        )
        assert r.status_code == 201, r.text
        assert r.headers["Location"] == f"/channel/{orders}/scheduled-message/later"
        scheduled = (await broker.http.get(r.headers["Location"])).json()
        assert scheduled["status"] == "SCHEDULED" and scheduled["dispatchedAt"] is None
        assert scheduled["messageId"] == "later" and scheduled["payload"] == "in three seconds"
        assert abs(datetime.fromisoformat(scheduled["dispatchSchedule"]) - due) < timedelta(
            milliseconds=1
        )
        message = (await broker.http.get(f"/channel/{orders}/message/later")).json()
        assert message["ScheduledFor"] is not None
        assert [j["Status"] for j in message["Jobs"]] == ["QUEUED"]
        # Not claimable, nor listed among the queued jobs, before its time.
        assert await billing.fetch(5, no_wait=True) == []
        listed = await broker.http.get(
            f"/channel/{orders}/consumer/billing/queued-jobs", headers=billing.headers
        )
        assert listed.json()["Result"] == []
        # A pull waiting for it gets it within a second after its time.
        job = await billing.next(expires=15)
        arrived = datetime.now(UTC)
        assert job is not None and job.text == "in three seconds"
        assert timedelta(0) <= arrived - due < timedelta(seconds=1), arrived - due
        await job.ack()
        scheduled = (await broker.http.get(f"/channel/{orders}/scheduled-message/later")).json()
        assert scheduled["status"] == "DISPATCHED" and scheduled["dispatchedAt"]
        # A message published at once is no scheduled message.
        await broker.publish(orders, "now", message_id="now")
        assert (
            await broker.http.get(f"/channel/{orders}/scheduled-message/now")
        ).status_code == 404


async def test_a_scheduled_message_is_pushed_at_its_time(process: BrokerProcess) -> None:
    with running_receiver() as receiver:
        async with channel_with_consumer(process, {}) as made:
            broker, orders = made.broker, made.channel
            await broker.put_consumer(
                orders, "hook", token="hook-token", type="push", callback_url=receiver.url + "/h"
            )
            headers = {**publisher(made), "X-Broker-Message-ID": "pushed-later"}
            due = datetime.now(UTC) + timedelta(seconds=3)
            due_monotonic = time.monotonic() + (due - datetime.now(UTC)).total_seconds()
            r = await broker.http.post(
                f"/channel/{orders}/broadcast",
                content=b"push me at three",
                headers={**headers, "X-Broker-Scheduled-For": rfc3339(due)},
            )
            assert r.status_code == 201, r.text
            await eventually(
                lambda: receiver.count("/h"), timeout=10, interval=0.02, what="the push at its time"
            )
            assert [r.body for r in receiver.requests] == [b"push me at three"]
            late = receiver.requests[0].at - due_monotonic
            assert 0 <= late < 1, late  # not before its time, within a second after


@pytest.mark.parametrize(
    ("value", "status", "text"),
    [
        ("tomorrow", 400, "invalid date format for X-Broker-Scheduled-For"),
        ("2030-01-01T10:00:00", 400, "invalid date format"),  # no offset: which zone?
        ("9999-12-31T23:59:59-01:00", 400, "invalid date format"),  # past the last UTC time
        ("2001-01-01T10:00:00Z", 412, "scheduled time must be at least 0 minutes"),
    ],
)
async def test_a_bad_schedule_is_refused(
    process: BrokerProcess, value: str, status: int, text: str
) -> None:
    async with channel_with_consumer(process, {}) as made:
        broker, orders = made.broker, made.channel
        r = await broker.http.post(
            f"/channel/{orders}/broadcast",
            content=b"x",
            headers={**publisher(made), "X-Broker-Scheduled-For": value},
        )
        assert r.status_code == status and text in r.json()["detail"], r.text
        # credentials come first, as in the Go original
        r = await broker.http.post(
            f"/channel/{orders}/broadcast",
            content=b"x",
            headers={"X-Broker-Channel-Token": "wrong", "X-Broker-Scheduled-For": value},
        )
        assert r.status_code in (401, 403)


def test_the_default_minimum_delay_is_two_minutes() -> None:
    assert load_config_text("").min_schedule_delay_minutes == 2


async def test_list_and_cancel_scheduled_messages(process: BrokerProcess) -> None:
    async with channel_with_consumer(process, {}) as made:
        broker, billing, orders = made.broker, made.consumer, made.channel
        credentials = publisher(made)
        soon = datetime.now(UTC) + timedelta(seconds=2)
        for message_id, at in (("far", soon + timedelta(hours=1)), ("soon", soon)):
            r = await broker.http.post(
                f"/channel/{orders}/broadcast",
                content=message_id.encode(),
                headers={
                    **credentials,
                    "X-Broker-Message-ID": message_id,
                    "X-Broker-Scheduled-For": rfc3339(at),
                },
            )
            assert r.status_code == 201, r.text
        await broker.publish(orders, "now", message_id="now")

        async def listed(query: str = "") -> list[str]:
            r = await broker.http.get(f"/channel/{orders}/scheduled-messages{query}")
            assert r.status_code == 200, r.text
            return sorted(url.rsplit("/", 1)[1] for url in r.json()["result"])

        async def messages(query: str = "") -> list[str]:
            r = await broker.http.get(f"/channel/{orders}/messages{query}")
            assert r.status_code == 200, r.text
            return sorted(url.rsplit("/", 1)[1] for url in r.json()["Result"])

        assert await listed() == ["far", "soon"]
        # The Go original's message statuses: ACKNOWLEDGED (101) until dispatched (102).
        assert await messages() == ["far", "now", "soon"]
        assert await messages("?status=ACKNOWLEDGED") == await messages("?status=101")
        assert await messages("?status=101") == ["far", "soon"]
        assert await messages("?status=DISPATCHED") == await messages("?status=102") == ["now"]
        assert await messages("?status=101&status=102") == ["far", "now", "soon"]
        assert (await broker.http.get(f"/channel/{orders}/messages?status=100")).status_code == 400
        refused = await broker.http.get(f"/channel/{orders}/messages?status=SCHEDULED")
        assert refused.status_code == 400 and "ACKNOWLEDGED" in refused.json()["detail"]
        counts = (await broker.http.get(f"/channel/{orders}/messages-status")).json()["Counts"]
        assert (counts["QUEUED"]["Count"], counts["SCHEDULED"]["Count"]) == (3, 2)
        assert await listed("?status=SCHEDULED") == await listed("?status=101") == ["far", "soon"]
        assert await listed("?status=DISPATCHED") == []
        bad = await broker.http.get(f"/channel/{orders}/scheduled-messages?status=LATER")
        assert bad.status_code == 400
        assert (await broker.http.get("/channel/none/scheduled-messages")).status_code == 404

        path = f"/channel/{orders}/scheduled-message/"
        wrong = {**credentials, "X-Broker-Producer-Token": "wrong"}
        assert (await broker.http.delete(path + "far", headers=wrong)).status_code == 403
        assert (await broker.http.delete(path + "far", headers=credentials)).status_code == 204
        assert (await broker.http.get(f"/channel/{orders}/message/far")).status_code == 404
        assert (await broker.http.delete(path + "far", headers=credentials)).status_code == 404
        assert (await broker.http.delete(path + "now", headers=credentials)).status_code == 404
        assert await listed() == ["soon"]
        # "now" is due; "soon" falls due in a moment, and is then past cancelling.
        got = [await billing.next(expires=10) for _ in range(2)]
        assert sorted(j.text for j in got if j is not None) == ["now", "soon"]
        late = await broker.http.delete(path + "soon", headers=credentials)
        assert late.status_code == 409 and "dispatched" in late.json()["detail"]
        assert await listed("?status=DISPATCHED") == await listed("?status=102") == ["soon"]
        info = await billing.info()
        assert (info.pending, info.ack_pending) == (0, 2)  # far's job went with it
