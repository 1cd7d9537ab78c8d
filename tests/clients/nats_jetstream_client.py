"""The `nats-jetstream` client from PyPI (the simplified consumer API, on `nats-core`), driven by
tests/bridge/test_official_clients.py with the same JSON-lines commands as tests/js/client.mjs.

It needs Python 3.13 (nats-core's releases require it), so it runs in a venv of its own
(`.venv-nats-jetstream`, made by scripts/test), never imported by the test suite itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from nats.client import connect
from nats.jetstream import new

COMPARED_HEADERS = ("Content-Type", "X-Order", "Nats-Msg-Id")


class Driver:
    def __init__(self) -> None:
        self.nc: Any = None
        self.js: Any = None
        self.consumer: Any = None
        self.held: dict[int, Any] = {}
        self.next_handle = 1

    def describe(self, msg: Any) -> dict[str, Any]:
        handle = self.next_handle
        self.next_handle += 1
        self.held[handle] = msg
        headers = msg.headers
        md = msg.metadata
        return {
            "handle": handle,
            "subject": msg.subject,
            "data": msg.data.decode(),
            "headers": {
                name: (headers.get(name) if headers is not None else None)
                for name in COMPARED_HEADERS
            },
            "info": {
                "stream": md.stream,
                "consumer": md.consumer,
                "deliveryCount": md.num_delivered,
                "redelivered": md.num_delivered > 1,
                "streamSequence": md.sequence.stream,
                "deliverySequence": md.sequence.consumer,
                "pending": md.num_pending,
            },
        }

    def message(self, args: dict[str, Any]) -> Any:
        return self.held[args["handle"]]

    async def run(self, op: str, args: dict[str, Any]) -> Any:
        if op == "connect":
            self.nc = await connect(args["servers"])
            self.js = new(self.nc)
            return True
        if op == "manager":
            info = await self.js.account_info()
            return {"api_level": getattr(info.api, "level", None)}
        if op == "consumer":
            self.consumer = await self.js.get_consumer(args["stream"], args["name"])
            return True
        if op == "info":
            ci = await self.consumer.get_info()
            config = ci.config
            return {
                "name": ci.name,
                "stream_name": ci.stream_name,
                "durable_name": config.durable_name,
                "ack_policy": str(config.ack_policy),
                "ack_wait": str(config.ack_wait),
                "max_deliver": config.max_deliver,
                "delivered": [ci.delivered.get("consumer_seq"), ci.delivered.get("stream_seq")],
                "ack_floor": [ci.ack_floor.get("consumer_seq"), ci.ack_floor.get("stream_seq")],
                "num_ack_pending": ci.num_ack_pending,
                "num_redelivered": ci.num_redelivered,
                "num_pending": ci.num_pending,
            }
        if op == "fetch":
            heartbeat = args.get("idle_heartbeat")
            batch = await self.consumer.fetch(
                max_messages=args["max_messages"],
                max_wait=args["expires"] / 1000,
                heartbeat=heartbeat / 1000 if heartbeat else None,
            )
            return [self.describe(msg) async for msg in batch]
        if op == "next":
            try:
                msg = await self.consumer.next(max_wait=args["expires"] / 1000)
            except TimeoutError:
                return None
            return self.describe(msg)
        if op == "consume":
            stream = await self.consumer.messages(max_messages=args["max_messages"])
            seen: list[dict[str, Any]] = []
            async for msg in stream:
                seen.append(self.describe(msg))
                if args.get("ack"):
                    await msg.ack()
                if len(seen) >= args["count"]:
                    break
            await stream.stop()
            return seen
        if op == "ordered":
            self.consumer = await self.js.ordered_consumer(args["stream"])
            return True
        if op == "readOrdered":
            # [data, stream sequence] of the next `count` messages, in the order they came.
            ordered = await self.consumer.messages(
                max_messages=args["max_messages"],
                max_wait=args["expires"] / 1000,
                heartbeat=args["expires"] / 2000,
            )
            got: list[list[Any]] = []
            async for msg in ordered:
                got.append([msg.data.decode(), msg.metadata.sequence.stream])
                if len(got) >= args["count"]:
                    break
            await ordered.stop()
            return got
        if op == "ack":
            await self.message(args).ack()
            return True
        if op == "ackAck":
            await self.message(args).double_ack()
            return True
        if op == "nak":
            await self.message(args).nak_with_delay(args["delay"] / 1000)
            return True
        if op == "working":
            await self.message(args).in_progress()
            return True
        if op == "term":
            await self.message(args).term_with_reason(args["reason"])
            return True
        if op == "flush":
            await self.nc.flush()
            return True
        if op == "close":
            await self.nc.close()
            return True
        raise ValueError(f"unknown op {op}")


async def main() -> None:
    driver = Driver()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            op = command.pop("op")
            answer = {"ok": await driver.run(op, command)}
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
