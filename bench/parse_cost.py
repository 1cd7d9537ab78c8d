"""`python -m bench.parse_cost`: the API's own CPU per batch ack item and per hot request,
measured inside one process (issue 40).

Not a throughput bench and not part of `python -m bench`: it times CPU (time.process_time) of
pure Python work, so run it on a quiet machine and read its figures as relative ones.

- parse: a batch ack body of 100 items (the bench's shape: id as a string, attempt, type), read
  as the route reads it (`app.api.routes.pull.ack_items`), in µs per item. With
  `--against REV`, the body is also validated by the schemas of git revision REV, loaded into
  this process beside the current ones, the two interleaved round by round: the ratio is
  what the change did, whatever the machine's speed.
- requests: single ack (progress), batch ack (100) and pull (100) sent as ASGI calls to the
  app create_app makes, with its middleware, routing, credentials, body reading, validation
  and response encoding, over services that answer at once (no database): the API's own
  µs per request. `--profile KIND` prints cProfile's top functions for one kind instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib.util
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from app.api import schemas
from app.api.app import create_app
from app.api.routes.pull import ack_items
from app.config import load_config_text
from app.domain.models import PulledJob
from app.domain.pulls import (
    AckItem,
    AckOutcome,
    AckResult,
    ConsumerCredentials,
    PullRequest,
    PullResult,
)
from app.roots.api import ApiRoot

ITEMS = 100
JOB_ID = 1_000_000_000_000
KINDS = ("ack", "batch-ack", "pull")


def batch_body(items: int = ITEMS) -> bytes:
    """What bench/loadgen.py sends: the pull's ID (a string) and Attempt, type ack."""
    acks = [{"id": str(JOB_ID + i), "attempt": 1, "type": "ack"} for i in range(items)]
    return orjson.dumps({"acks": acks})


def cpu_per_call(call: Callable[[], object], calls: int) -> float:
    """µs of this process's CPU per call."""
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls * 1e6


# ---------------------------------------------------------------------------------------------
# Parsing a batch ack body


def schemas_at(rev: str) -> tuple[Any, Callable[..., Any]]:
    """AcksBody and parse of app/api/schemas as they were at `rev`, as modules of their own."""
    root = Path(__file__).resolve().parent.parent
    names = {"common": "bench_against_common", "pull": "bench_against_pull"}
    modules: dict[str, ModuleType] = {}
    for name, alias in names.items():
        source = subprocess.run(
            ["git", "show", f"{rev}:app/api/schemas/{name}.py"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        source = source.replace("app.api.schemas.common", names["common"])
        spec = importlib.util.spec_from_loader(alias, loader=None)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[alias] = module  # pydantic resolves the annotations through it
        exec(compile(source, f"{rev}:app/api/schemas/{name}.py", "exec"), module.__dict__)
        modules[name] = module
    return modules["pull"].AcksBody, modules["common"].parse


def measure_parse(against: str | None, rounds: int, calls: int) -> None:
    body = batch_body()
    items = ack_items(body)
    assert len(items) == ITEMS and items[0] == AckItem(JOB_ID, items[0].type, 1)
    full = [cpu_per_call(lambda: ack_items(body), calls) / ITEMS for _ in range(rounds)]
    print(f"batch ack body, read as the route reads it: {min(full):.3f} µs per item")
    if against is None:
        return
    old_model, old_parse = schemas_at(against)
    assert [a.id for a in old_parse(old_model, body).acks] == [i.id for i in items]
    now: list[float] = []
    then: list[float] = []
    for _ in range(rounds):  # interleaved: both see the same machine
        then.append(cpu_per_call(lambda: old_parse(old_model, body), calls) / ITEMS)
        now.append(cpu_per_call(lambda: schemas.parse(schemas.AcksBody, body), calls) / ITEMS)
    print(
        f"validation only: {min(then):.3f} µs per item at {against}, {min(now):.3f} now "
        f"(now / then {min(now) / min(then):.2f})"
    )


# ---------------------------------------------------------------------------------------------
# Requests through the app, over services that answer at once


class Acks:
    async def ack(self, creds: ConsumerCredentials, job_id: str, item: AckItem) -> AckOutcome:
        return AckOutcome(int(job_id), AckResult.EXTENDED, "", datetime.now(UTC))

    async def ack_many(
        self, creds: ConsumerCredentials, items: Sequence[AckItem]
    ) -> list[AckOutcome]:
        return [AckOutcome(item.id, AckResult.DONE, "acked") for item in items]


class Pulls:
    def __init__(self) -> None:
        lease = datetime.now(UTC) + timedelta(seconds=30)
        self._jobs = [
            PulledJob(
                JOB_ID + i,
                1,
                0,
                lease,
                lease,
                f"message-{i}",
                b'{"order": %d, "status": "paid"}' % i,
                "application/json",
                {},
            )
            for i in range(ITEMS)
        ]

    async def authenticate(self, creds: ConsumerCredentials) -> None:
        return None

    async def pull(self, creds: ConsumerCredentials, request: PullRequest) -> PullResult:
        return PullResult(self._jobs[: request.batch], 0)


def app_over_stand_ins() -> Any:
    folder = Path(tempfile.mkdtemp(prefix="parse-cost-"))
    config = load_config_text(
        f"[rdbms]\ndialect=sqlite\nconnection-url={folder / 'never-opened.sqlite3'}\n"
        "[http]\ntoken-hash-key=parse-cost-bench\n"
    )
    runtime = ApiRoot(config, listen=False)
    runtime.acks = Acks()  # type: ignore[assignment]
    runtime.pulls = Pulls()  # type: ignore[assignment]
    return create_app(config, runtime)


def asgi_call(app: Any, path: str, body: bytes) -> Callable[[], Awaitable[int]]:
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-broker-channel-token", b"channel-token"),
        (b"x-broker-consumer-token", b"consumer-token"),
        (b"user-agent", b"bench"),
    ]
    request = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return request

    async def call() -> int:
        status = 0

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
            "state": {},
        }
        await app(scope, receive, send)
        return status

    return call


def request_of(app: Any, kind: str) -> Callable[[], Awaitable[int]]:
    base = "/channel/c1/consumer/k1"
    if kind == "ack":
        return asgi_call(app, f"{base}/job/{JOB_ID}/ack", b'{"type": "progress"}')
    if kind == "batch-ack":
        return asgi_call(app, f"{base}/ack", batch_body())
    return asgi_call(app, f"{base}/pull", b'{"batch": %d, "no_wait": true}' % ITEMS)


async def measure_requests(kinds: Sequence[str], rounds: int, calls: int) -> None:
    app = app_over_stand_ins()
    for kind in kinds:
        call = request_of(app, kind)
        status = await call()
        assert status == 200, (kind, status)
        best = float("inf")
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(calls):
                await call()
            best = min(best, (time.process_time() - started) / calls * 1e6)
        print(f"{kind}: {best:.1f} µs of API CPU per request (services answer at once)")


async def profile(kind: str, calls: int, top: int) -> None:
    call = request_of(app_over_stand_ins(), kind)
    for _ in range(100):
        await call()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        await call()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.parse_cost", description=__doc__)
    parser.add_argument("--against", metavar="REV", help="also validate with REV's schemas")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300, help="bodies or requests per round")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--profile", choices=KINDS, help="cProfile one kind of request")
    args = parser.parse_args()
    if args.profile:
        asyncio.run(profile(args.profile, args.calls * 10, 40))
        return
    measure_parse(args.against, args.rounds, args.calls)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    asyncio.run(measure_requests(kinds, args.rounds, args.calls))


if __name__ == "__main__":
    main()
