"""A real broker process (`python -m app serve`) on a free loopback port, and a channel with a
producer and a pull consumer made through the client: the client tests' fixtures build on
them, and other suites start the same process."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from webhook_broker_client import Broker, PullConsumer

from devtools.pg import free_port
from tests.helpers.waiting import eventually_sync

START_SECONDS = 60.0
CONSUMER = "billing"


class BrokerProcess:
    """One `serve` process; stop() and start() again keep its port and database."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.port = free_port()
        config.write_text(config.read_text() + f"[http]\nlistener=127.0.0.1:{self.port}\n")
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = (self.config.parent / f"serve-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", "--config", str(self.config), "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.config.parent,
            env={**os.environ, "HOME": str(self.config.parent)},
        )
        process = self.process

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the broker exited: {self.log()}")
            try:
                return httpx.get(f"{self.url}/_status", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        try:
            eventually_sync(ready, START_SECONDS, what="the broker's /_status answers 200")
        except AssertionError:
            pytest.fail(f"the broker did not start: {self.log()}")

    def log(self) -> str:
        return (self.config.parent / f"serve-{self.starts}.log").read_text()[-3000:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


_channels = itertools.count(1)


@dataclass
class Setup:
    broker: Broker
    consumer: PullConsumer
    process: BrokerProcess
    consumer_token: str
    channel: str


@asynccontextmanager
async def channel_with_consumer(
    process: BrokerProcess, consumer_settings: dict[str, str]
) -> AsyncIterator[Setup]:
    """A new channel (its token `orders-token`), the producer `shop` and the pull consumer
    `billing` (token `billing-token`), made through the client."""
    channel = f"orders-{next(_channels)}"
    async with Broker(process.url, producer_id="shop") as broker:
        await broker.put_channel(channel, token="orders-token")
        broker.producer_token = (await broker.put_producer("shop", token="shop-token"))["Token"]
        await broker.put_consumer(channel, CONSUMER, token="billing-token", **consumer_settings)
        consumer = broker.consumer(channel, CONSUMER, consumer_token="billing-token")
        yield Setup(broker, consumer, process, "billing-token", channel)


async def job_state(setup: Setup, job_id: str) -> dict[str, object]:
    response = await setup.broker.http.get(
        f"{setup.consumer.path}/job/{job_id}", headers=setup.consumer.headers
    )
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body
