"""SIGKILL the dispatcher process mid-delivery: after a restart every job ends DELIVERED."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from app.config import Config
from app.runtime import Runtime
from devtools.pg import free_port
from tests.helpers.push import publish, setup_push
from tests.helpers.receiver import Receiver, running_receiver
from tests.helpers.waiting import eventually

JOBS = 500


@pytest.fixture
def backend() -> str:
    return "postgresql"


@pytest.fixture
def extra_config() -> str:
    return (
        "[broker]\nmax-retry=5\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=8\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=1\n"
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as r:
        r.respond = lambda _path, _n: (200, 0.01)
        yield r


def spawn(config_file: Path, command: str) -> subprocess.Popen[bytes]:
    log = (config_file.parent / f"{command}-{time.monotonic_ns()}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "app", "--config", str(config_file), command],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=config_file.parent,
        env={**os.environ, "HOME": str(config_file.parent)},
    )


async def push_messages(
    config: Config, runtime: Runtime, receiver: Receiver, payloads: dict[str, bytes]
) -> None:
    """A push consumer of the receiver and one message per (id, payload), through the API."""
    from app.api.app import create_app

    transport = httpx.ASGITransport(app=create_app(config, runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
        await setup_push(http, receiver.url + "/hook")
        for message_id, payload in payloads.items():
            await publish(http, payload, message_id)


def dispatcher_log(directory: Path) -> str:
    return next(directory.glob("dispatcher-*.log")).read_text()


def delivered(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM job WHERE status = 'DELIVERED'").fetchone()
        assert row is not None
        return int(row[0])


async def test_sigkill_mid_delivery_loses_nothing(
    rdbms: str,
    extra_config: str,
    runtime: Runtime,
    config: Config,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    await push_messages(
        config, runtime, receiver, {f"m{n}": b"payload-%d" % n for n in range(JOBS)}
    )

    config_file = tmp_path / "webhook-broker.cfg"
    config_file.write_text(rdbms + extra_config)
    url = config.database.connection_url

    first = spawn(config_file, "dispatcher")
    await eventually(lambda: delivered(url) >= JOBS // 5, 60, what="a fifth delivered")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    at_kill = delivered(url)
    assert at_kill < JOBS, "the kill came too late to interrupt deliveries"

    second = spawn(config_file, "dispatcher")
    sweeper = spawn(config_file, "sweeper")
    try:
        await eventually(lambda: delivered(url) >= JOBS, 120, 0.1, what="every job delivered")
    finally:
        for proc in (second, sweeper):
            proc.send_signal(signal.SIGTERM)
        for proc in (second, sweeper):
            assert proc.wait(timeout=30) == 0

    assert delivered(url) == JOBS
    received = receiver.by_message()
    assert set(received) == {f"m{n}" for n in range(JOBS)}
    duplicates = sum(received.values()) - JOBS
    print(f"\nkill test: {at_kill} delivered at the kill, {duplicates} duplicate deliveries")


async def test_sigterm_drains_and_a_second_signal_exits_at_once(
    rdbms: str,
    extra_config: str,
    runtime: Runtime,
    config: Config,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    """A delivery hangs (the receiver answers after 20 s, past a 15 s timeout): SIGTERM waits
    for it and says for how long; a second SIGTERM ends the process at once (status 1), and
    the job's lease is there for the sweeper."""
    receiver.respond = lambda _path, _n: (200, 20.0)
    await push_messages(config, runtime, receiver, {"slow": b"slow"})
    config_file = tmp_path / "webhook-broker.cfg"
    config_file.write_text(
        rdbms
        + extra_config.replace(
            "connection-timeout-in-seconds=1", "connection-timeout-in-seconds=15"
        )
    )
    dispatcher = spawn(config_file, "dispatcher")
    await eventually(lambda: receiver.count("/hook"), 30, what="the delivery in flight")
    assert receiver.count("/hook") == 1
    dispatcher.send_signal(signal.SIGTERM)
    await asyncio.sleep(1.0)  # time passes on purpose: the drain must still be waiting after it
    assert dispatcher.poll() is None, "the first signal drains: the delivery is still in flight"
    started = time.monotonic()
    dispatcher.send_signal(signal.SIGTERM)
    assert dispatcher.wait(timeout=5) == 1
    assert time.monotonic() - started < 5
    log = dispatcher_log(tmp_path)
    assert "dispatcher stopping: work in flight ends within 25 s" in log
    assert "second stop signal, exiting now" in log
    with psycopg.connect(config.database.connection_url) as conn:
        row = conn.execute("SELECT status FROM job").fetchone()
    assert row is not None and row[0] == "INFLIGHT"  # leased: the sweeper gives it back


async def test_worker_processes_serve_metrics_on_their_own_port(
    rdbms: str,
    extra_config: str,
    runtime: Runtime,
    config: Config,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    """[metrics] listener: a dispatcher counts its deliveries, a sweeper its runs."""
    await push_messages(config, runtime, receiver, {f"m{n}": b"x" for n in range(3)})
    ports = {"dispatcher": free_port(), "sweeper": free_port()}
    procs = {}
    for command, port in ports.items():
        config_file = tmp_path / f"{command}.cfg"
        config_file.write_text(rdbms + extra_config + f"[metrics]\nlistener=127.0.0.1:{port}\n")
        procs[command] = spawn(config_file, command)
    try:
        wanted = {
            "dispatcher": 'webhook_broker_push_deliveries_total{outcome="delivered"} 3.0',
            "sweeper": "webhook_broker_sweeper_run_duration_seconds_count",
        }
        async with httpx.AsyncClient() as scraper:
            for command, line in wanted.items():
                deadline = time.monotonic() + 30
                text = ""
                while line not in text and time.monotonic() < deadline:
                    with contextlib.suppress(httpx.HTTPError):
                        url = f"http://127.0.0.1:{ports[command]}/metrics"
                        text = (await scraper.get(url)).text
                    await asyncio.sleep(0.2)
                assert line in text, (command, text[-2000:])
                assert "process_cpu_seconds_total" in text
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            assert proc.wait(timeout=30) == 0
