"""A bare POST loop of one HTTP client: `python -m bench.post_clients CLIENT URL [options]`.

The push dispatcher's ceiling: the same payload and headers as a delivery, the same number in
flight, to the same receiver, with no database. Run as its own process so that its CPU is its
own; prints one JSON line: requests, seconds, CPU seconds (every thread of the process, so a
client that works in native threads is charged for them), errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

CLIENTS = ("httpx", "aiohttp", "pyreqwest", "httpx-aiohttp")

Post = Callable[[bytes, dict[str, str]], Awaitable[int]]


def headers(size: int) -> dict[str, str]:
    """The header set a delivery carries (values of realistic length)."""
    return {
        "Content-Type": "application/json",
        "X-Broker-Message-Priority": "0",
        "X-Broker-Message-ID": "m-0123456789",
        "X-Broker-Channel-ID": "pushch",
        "X-Broker-Consumer-ID": "push1",
        "X-Broker-Consumer-Token": "push1-token",
        "User-Agent": "webhook-broker",
        "X-Request-ID": "0" * 32,
        "X-Broker-Delivery-Attempt": "1",
        "X-Broker-Signature": "t=1764000000,v1=" + "a" * 64,
        "webhook-id": "msg_0123456789",
        "webhook-timestamp": "1764000000",
        "webhook-signature": "v1," + "A" * 43 + "=",
        "Content-Length": str(size),
    }


async def open_client(name: str, url: str, concurrency: int) -> tuple[Post, Callable[[], Any]]:
    if name == "httpx" or name == "httpx-aiohttp":
        import httpx

        transport = None
        if name == "httpx-aiohttp":
            from httpx_aiohttp import AiohttpTransport

            transport = AiohttpTransport()
        client = httpx.AsyncClient(
            timeout=10,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=32),
            transport=transport,
        )

        async def post_httpx(body: bytes, h: dict[str, str]) -> int:
            return (await client.post(url, content=body, headers=h)).status_code

        return post_httpx, client.aclose
    if name == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency),
            timeout=aiohttp.ClientTimeout(total=10),
            skip_auto_headers=("User-Agent",),
        )

        async def post_aiohttp(body: bytes, h: dict[str, str]) -> int:
            async with session.post(url, data=body, headers=h) as response:
                await response.read()
                return response.status

        return post_aiohttp, session.close
    if name == "pyreqwest":
        from pyreqwest.client import ClientBuilder

        reqwest = (
            ClientBuilder()
            .max_connections(concurrency)
            .timeout(timedelta(seconds=10))
            .follow_redirects(False)
            .build()
        )

        async def post_reqwest(body: bytes, h: dict[str, str]) -> int:
            request = reqwest.post(url).headers(h).body_bytes(body).build()
            return (await request.send()).status

        return post_reqwest, reqwest.close
    raise SystemExit(f"unknown client {name!r}; known: {', '.join(CLIENTS)}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    body = b'{"payload": "' + b"x" * max(0, args.payload - 15) + b'"}'
    h = headers(len(body))
    if args.client != "aiohttp":
        del h["Content-Length"]  # the others set it themselves
    post, close = await open_client(args.client, args.url, args.concurrency)
    counted = {"requests": 0, "errors": 0}
    counting = False
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            try:
                status = await post(body, h)
                ok = 200 <= status < 300
            except Exception:
                ok = False
            if counting:
                counted["requests" if ok else "errors"] += 1

    workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
    await asyncio.sleep(args.warmup)
    counting = True
    cpu0, main0, t0 = time.process_time(), time.thread_time(), time.monotonic()
    await asyncio.sleep(args.seconds)
    counting = False
    cpu1, main1, t1 = time.process_time(), time.thread_time(), time.monotonic()
    stop.set()
    await asyncio.gather(*workers, return_exceptions=True)
    await close()
    return {
        "client": args.client,
        "concurrency": args.concurrency,
        "requests": counted["requests"],
        "errors": counted["errors"],
        "seconds": t1 - t0,
        "cpu_seconds": cpu1 - cpu0,
        "main_thread_cpu_seconds": main1 - main0,  # the event loop's thread alone
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.post_clients", description=__doc__)
    p.add_argument("client", choices=CLIENTS)
    p.add_argument("url")
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--payload", type=int, default=100, help="body bytes (100, as pushed)")
    args = p.parse_args()
    import uvloop

    print(json.dumps(uvloop.run(run(args))))


if __name__ == "__main__":
    main()
