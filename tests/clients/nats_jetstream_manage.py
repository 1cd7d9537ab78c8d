"""Consumer management with the nats-jetstream client (PyPI; the simplified JetStream API on
nats-core, Python 3.13), driven by tests/bridge/test_consumer_management_clients.py: one JSON
command per line on stdin, one JSON answer per line ({"ok": ...} or {"failed": ...}). Durations
come in as nanoseconds and go out as nanoseconds."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

from nats.client import connect
from nats.jetstream import new

COMPARED = (
    "durable_name",
    "name",
    "description",
    "deliver_policy",
    "ack_policy",
    "ack_wait",
    "max_deliver",
    "filter_subject",
    "max_waiting",
    "max_ack_pending",
)
DURATIONS = ("ack_wait",)


def plain(value: Any) -> Any:
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1_000_000_000)
    if hasattr(value, "value"):  # an enum
        return value.value
    return value


def seen(info: Any) -> dict[str, Any]:
    config = {key: plain(getattr(info.config, key, None)) for key in COMPARED}
    return {"name": info.name, "stream_name": info.stream_name, "config": config}


def given(config: dict[str, Any]) -> dict[str, Any]:
    out = dict(config)
    for key in DURATIONS:
        if key in out:
            out[key] = timedelta(microseconds=out[key] / 1000)
    return out


class Driver:
    def __init__(self) -> None:
        self.nc: Any = None
        self.js: Any = None

    async def connect(self, servers: str) -> bool:
        self.nc = await connect(servers)
        self.js = new(self.nc)
        return True

    async def add(self, stream: str, config: dict[str, Any]) -> Any:
        config = given(config)
        name = config.pop("durable_name")
        consumer = await self.js.create_consumer(stream, name, durable_name=name, **config)
        return seen(await consumer.get_info())

    async def update(self, stream: str, name: str, config: dict[str, Any]) -> Any:
        config = given(config)
        config.pop("durable_name", None)
        consumer = await self.js.update_consumer(stream, name, durable_name=name, **config)
        return seen(await consumer.get_info())

    async def info(self, stream: str, name: str) -> Any:
        return seen(await self.js.get_consumer_info(stream, name))

    async def list(self, stream: str) -> Any:
        return sorted([name async for name in self.js.consumer_names(stream)])

    async def delete(self, stream: str, name: str) -> Any:
        return await self.js.delete_consumer(stream, name)

    async def close(self) -> bool:
        await self.nc.close()
        return True


async def main() -> None:
    driver = Driver()
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = json.loads(line)
        op = command.pop("op")
        try:
            answer: dict[str, Any] = {"ok": await getattr(driver, op)(**command)}
        except Exception as exc:  # every failure is an answer the test compares
            answer = {
                "failed": {
                    "code": getattr(exc, "code", None),
                    "err_code": getattr(exc, "error_code", None),
                    "description": str(exc),
                }
            }
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


asyncio.run(main())
