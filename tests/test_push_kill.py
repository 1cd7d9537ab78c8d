"""SIGKILL the dispatcher process mid-delivery: after a restart every job ends DELIVERED."""

from __future__ import annotations

import asyncio
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
from tests.receiver import Receiver, running_receiver
from tests.test_push import publish, setup_push

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
    from app.api.app import create_app

    transport = httpx.ASGITransport(app=create_app(config, runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
        await setup_push(http, receiver.url + "/hook")
        for n in range(JOBS):
            await publish(http, b"payload-%d" % n, f"m{n}")

    config_file = tmp_path / "webhook-broker.cfg"
    config_file.write_text(rdbms + extra_config)
    url = config.database.connection_url

    first = spawn(config_file, "dispatcher")
    deadline = time.monotonic() + 60
    while delivered(url) < JOBS // 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    at_kill = delivered(url)
    assert at_kill < JOBS, "the kill came too late to interrupt deliveries"

    second = spawn(config_file, "dispatcher")
    sweeper = spawn(config_file, "sweeper")
    try:
        deadline = time.monotonic() + 120
        while delivered(url) < JOBS and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
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
