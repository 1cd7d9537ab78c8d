"""Priority groups across real processes on one PostgreSQL: two `webhook-broker api`, two
`webhook-broker bridge` (one queue group) and a `webhook-broker sweeper`. A pin taken through
one API process holds in the other and in the bridges; when its client stops pulling, the
sweeper lets it lapse and a standby on the other API process is pinned, with the advisories
published by the processes that made each change; overflow counts agree everywhere."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from app.config import Config
from devtools.pg import free_port
from tests.bridge.conftest import publish_http, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.waiting import eventually

REPO_ROOT = str(Path(__file__).resolve().parents[2])
PIN_TIMEOUT = 2
AUTH = {"X-Broker-Channel-Token": "orders-token"}


class Processes:
    def __init__(self, root: Path, cfg: Path) -> None:
        self.root = root
        self.cfg = cfg
        self.started: list[tuple[str, asyncio.subprocess.Process]] = []

    async def start(self, name: str, command: str, **env: str) -> asyncio.subprocess.Process:
        log = (self.root / f"{name}.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "--config",
            str(self.cfg),
            command,
            cwd=self.root,
            env={**os.environ, "PYTHONPATH": REPO_ROOT, **env},
            stdout=log,
            stderr=log,
        )
        self.started.append((name, process))
        return process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]

    async def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for _, process in self.started:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for name, process in self.started:
            try:
                codes[name] = await asyncio.wait_for(process.wait(), timeout=20)
            except TimeoutError:
                process.kill()
                codes[name] = await process.wait()
        return codes


@pytest.fixture
async def processes(config: Config, hub: NatsServer) -> AsyncIterator[Processes]:
    root = Path(tempfile.mkdtemp(prefix="wb-priority-"))
    cfg = root / "broker.cfg"
    cfg.write_text(
        "[rdbms]\ndialect=postgresql\n"
        f"connection-url={config.database.connection_url}\n"
        "[broker]\nrational-delay-in-seconds=1\n"
        "[log]\nlog-level=warning\n"
        f"[nats]\nurl={hub.url}\nqueue-group=priority-bridges\n"
    )
    running = Processes(root, cfg)
    try:
        yield running
    finally:
        codes = await running.stop()
        assert all(code == 0 for code in codes.values()), {
            name: running.log(name) for name, code in codes.items() if code != 0
        }


async def ready(url: str, processes: Processes, name: str) -> None:
    async with httpx.AsyncClient(base_url=url) as http:

        async def answers() -> bool:
            try:
                return (await http.get("/_status")).status_code == 200
            except httpx.TransportError:
                return False

        try:
            await eventually(answers, 30, 0.1, what=f"{name} answering")
        except AssertionError:
            raise AssertionError(f"{name} never answered:\n{processes.log(name)}") from None


def consumer_auth(name: str) -> dict[str, str]:
    return {**AUTH, "X-Broker-Consumer-Token": f"{name}-token"}


async def pull(http: httpx.AsyncClient, consumer: str, **body: Any) -> httpx.Response:
    return await http.post(
        f"/channel/orders/consumer/{consumer}/pull", json=body, headers=consumer_auth(consumer)
    )


def payloads(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [job["Message"]["Payload"] for job in response.json()["Jobs"]]


@uncapped_only
async def test_pins_and_overflow_counts_hold_across_processes(
    processes: Processes, hub: NatsServer, client: httpx.AsyncClient
) -> None:
    for name, policy, extra in (
        ("pin", "pinned_client", {"priorityTimeout": str(PIN_TIMEOUT)}),
        ("over", "overflow", {}),
    ):
        form = {"token": f"{name}-token", "type": "pull", "priorityGroups": "jobs",
                "priorityPolicy": policy, **extra}  # fmt: skip
        response = await client.put(f"/channel/orders/consumer/{name}", data=form)
        assert response.status_code == 200, response.text
    ports = [free_port(), free_port()]
    for n, port in enumerate(ports):
        await processes.start(f"api{n}", "api", WEBHOOK_BROKER__HTTP__LISTENER=f"127.0.0.1:{port}")
    await processes.start("bridge0", "bridge")
    await processes.start("bridge1", "bridge")
    await processes.start("sweeper", "sweeper")
    for n, port in enumerate(ports):
        await ready(f"http://127.0.0.1:{port}", processes, f"api{n}")
    nc = await nats.connect(hub.url)
    advised: list[dict[str, Any]] = []

    async def collect(msg: Any) -> None:
        advised.append(json.loads(msg.data))

    await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.>", cb=collect)

    async def a_bridge_answers() -> bool:
        try:
            await nc.request("$JS.API.INFO", b"", timeout=0.5)
        except Exception:
            return False
        return True

    await eventually(a_bridge_answers, 60, 0.1, what="a bridge answering")
    a = httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", timeout=30)
    b = httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[1]}", timeout=30)
    try:
        await publish_http(client, ["j1", "j2", "j3"])
        first = await pull(a, "pin", group="jobs", no_wait=True)
        assert payloads(first) == ["j1"]
        pin = first.json()["PinId"]
        assert payloads(await pull(b, "pin", group="jobs", expires=0.5)) == []  # a standby
        other = await nc.request(
            "$JS.API.CONSUMER.MSG.NEXT.orders.pin",
            json.dumps({"group": "jobs", "id": "someone", "expires": 500_000_000}).encode(),
            timeout=5,
        )
        assert (other.headers or {}).get("Status") == "423", other.headers
        again = await pull(b, "pin", group="jobs", id=pin, no_wait=True)
        assert payloads(again) == ["j2"] and again.json()["PinId"] == pin

        # The pinned client stops pulling: within the timeout and a sweep, the standby on the
        # other API process is pinned and gets j3; the old pin is refused.
        standby = await pull(b, "pin", group="jobs", expires=PIN_TIMEOUT + 8)
        assert payloads(standby) == ["j3"]
        assert standby.json()["PinId"] not in (None, pin)
        # (A pull that arrives naming the old pin while another is held: a mismatch.)
        stale = await pull(a, "pin", group="jobs", id=pin, no_wait=True)
        assert stale.status_code == 423 and "Nats-Pin-Id mismatch" in stale.json()["detail"]

        # Overflow: three pending for `over` (j1..j3), counted alike by a bridge and both API
        # processes.
        over = await nc.request(
            "$JS.API.CONSUMER.MSG.NEXT.orders.over",
            json.dumps({"group": "jobs", "min_pending": 3, "expires": 1_000_000_000}).encode(),
            timeout=5,
        )
        assert over.data == b"j1"
        await nc.publish(over.reply, b"+ACK")
        assert payloads(await pull(a, "over", group="jobs", min_pending=3, no_wait=True)) == []
        assert payloads(await pull(b, "over", group="jobs", min_pending=2, no_wait=True)) == ["j2"]
        await nc.flush()
        await eventually(lambda: len(advised) >= 3, what="the three pin advisories")
    finally:
        await a.aclose()
        await b.aclose()
        await nc.close()
    kinds = [(d["type"].rsplit(".", 1)[-1], d.get("reason")) for d in advised]
    assert kinds[:3] == [
        ("consumer_group_pinned", None),  # by api0
        ("consumer_group_unpinned", "timeout"),  # by the sweeper
        ("consumer_group_pinned", None),  # by api1
    ], advised
    assert advised[2]["pinned_id"] == standby.json()["PinId"]
