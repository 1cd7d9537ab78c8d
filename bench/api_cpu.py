"""`python -m bench.api_cpu`: API CPU per request, one kind of request at a time (issue 40).

For judging a change to the API's hot paths on a busy machine: CPU time per request is far less
disturbed by other load than throughput is. Starts a throwaway PostgreSQL (devtools/pg.py), one
`webhook-broker api` process (or, with --floor, the bare floor of bench/floor.py) with the
bench's seeds, sends `--requests` requests of each kind with `--concurrency` in flight, and
reads the server process's user + system CPU from /proc/<pid>/stat before and after:

  publish    POST /channel/pub/broadcast (fan-out 5)
  ack        POST .../job/{id}/ack, jobs claimed before the measurement
  batch-ack  POST .../ack of 100 jobs, claimed before the measurement
  pull       POST .../pull, batch 100

`--repeat` measures each kind that many times; each line: kind, µs of CPU per request.
Not part of `python -m bench` (which measures throughput on a quiet machine).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import db
from bench.broker import Broker, broker_argv, channel_of, token, wait_http
from bench.http1 import Connection
from bench.procs import Service
from devtools.pg import Cluster, free_port

KINDS = ("publish", "ack", "batch-ack", "pull")
CONSUMER = {"ack": "pull-each", "batch-ack": "pull-batch", "pull": "pull-batch"}
BATCH = 100
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def post(path: str, body: Any, headers: dict[str, str], conn: Connection) -> Any:
    return await conn.post_json(path, body, headers)


def consumer_headers(consumer: str) -> dict[str, str]:
    channel = channel_of(consumer)
    return {"X-Broker-Channel-Token": token(channel), "X-Broker-Consumer-Token": token(consumer)}


def base(consumer: str) -> str:
    return f"/channel/{channel_of(consumer)}/consumer/{consumer}"


class Probe:
    def __init__(self, port: int, conn_db: Any, pks: dict[str, int]) -> None:
        self.port = port
        self.db = conn_db
        self.pks = pks

    async def claimed(self, consumer: str, count: int) -> list[tuple[str, int]]:
        """`count` jobs of `consumer` claimed now (in flight), as (id, attempt)."""
        await db.ensure_backlog(
            self.db, consumer_pk=self.pks[consumer], need=count, channel=channel_of(consumer),
            producer="bp",
        )  # fmt: skip
        conn = Connection(self.port)
        jobs: list[tuple[str, int]] = []
        try:
            while len(jobs) < count:
                body = {"batch": min(256, count - len(jobs)), "no_wait": True}
                response = await conn.post_json(
                    f"{base(consumer)}/pull", body, consumer_headers(consumer)
                )
                got = response.json()["Jobs"]
                if not got:
                    raise RuntimeError("the backlog ran dry")
                jobs += [(j["ID"], j["Attempt"]) for j in got]
        finally:
            await conn.close()
        return jobs

    async def requests(self, kind: str, count: int) -> list[Callable[[Connection], Awaitable[Any]]]:
        """The `count` requests of one kind, each a call on a connection."""
        if kind == "publish":
            payload = db.payload().encode()
            headers = {
                "X-Broker-Channel-Token": token("pub"),
                "X-Broker-Producer-ID": "bp",
                "X-Broker-Producer-Token": token("bp"),
                "Content-Type": "application/json",
            }
            return [lambda c: c.request("POST", "/channel/pub/broadcast", headers, payload)] * count
        consumer = CONSUMER[kind]
        headers = consumer_headers(consumer)
        path = base(consumer)
        if kind == "pull":
            await db.ensure_backlog(
                self.db, consumer_pk=self.pks[consumer], need=count * BATCH + BATCH,
                channel=channel_of(consumer), producer="bp",
            )  # fmt: skip
            body = {"batch": BATCH, "expires": 1.0}
            return [lambda c: c.post_json(f"{path}/pull", body, headers)] * count
        if kind == "ack":
            jobs = await self.claimed(consumer, count)
            return [
                functools.partial(post, f"{path}/job/{j}/ack", {"attempt": a}, headers)
                for j, a in jobs
            ]
        jobs = await self.claimed(consumer, count * BATCH)
        calls: list[Callable[[Connection], Awaitable[Any]]] = []
        for i in range(count):
            acks = [{"id": j, "attempt": a, "type": "ack"} for j, a in jobs[i * BATCH :][:BATCH]]
            calls.append(functools.partial(post, f"{path}/ack", {"acks": acks}, headers))
        return calls

    async def run(
        self, pid: int, kind: str, count: int, concurrency: int, pyspy: Path | None = None
    ) -> float:
        """µs of the server's CPU per request of `kind` (a tenth as many of the 100-job kinds)."""
        if kind in ("batch-ack", "pull"):
            count = max(20, count // 10)
        calls = await self.requests(kind, count)
        conns = [Connection(self.port) for _ in range(concurrency)]
        statuses: dict[int, int] = {}

        async def worker(conn: Connection) -> None:
            while calls:
                response = await calls.pop()(conn)
                statuses[response.status] = statuses.get(response.status, 0) + 1

        spy = None
        if pyspy is not None:
            out = pyspy / f"{kind}.txt"
            spy = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
                "--rate", "500", "--format", "raw", "-o", str(out),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(1.0)
        before = cpu_seconds(pid)
        try:
            await asyncio.gather(*(worker(c) for c in conns))
        finally:
            for conn in conns:
                await conn.close()
        used = cpu_seconds(pid) - before
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await spy.wait()
        bad = {s: n for s, n in statuses.items() if s >= 300}
        if bad:
            raise RuntimeError(f"{kind}: unexpected statuses {bad}")
        return used / count * 1e6


async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="wb-apicpu-"))
    if os.geteuid() == 0:
        os.chmod(workdir, 0o755)  # as bench/env.py: the broker runs as root, PostgreSQL not
    cluster = Cluster(statements=False)
    await asyncio.to_thread(cluster.start)
    server: Service | None = None
    try:
        async with await db.connect(cluster.base_url) as conn:
            await conn.execute("CREATE DATABASE bench")
        url = cluster.url("bench")
        broker = Broker(workdir, url, free_port(), "nats://127.0.0.1:1", 1)
        # No NATS here: the API would try to publish its advisories there.
        text = broker.config.read_text().replace("[nats]\nurl=nats://127.0.0.1:1\n", "")
        broker.config.write_text(text)
        await asyncio.to_thread(broker.migrate)
        port = broker.api_ports[0]
        env = {
            "WEBHOOK_BROKER__HTTP__LISTENER": f"127.0.0.1:{port}",
            # Claimed jobs stay in flight for the whole measurement.
            "WEBHOOK_BROKER__CONSUMER_CONNECTION__CONNECTION_TIMEOUT_IN_SECONDS": "3600",
        }
        if args.floor:
            # The floor reads the seeds the API wrote: one API start first.
            api = Service("seed", [*broker_argv(), "--config", str(broker.config), "api"],
                          logdir=workdir, env=env, cwd=workdir)  # fmt: skip
            await api.start()
            await wait_http(api, port)
            await api.stop()
            argv = [sys.executable, "-m", "bench.floor", "--config", str(broker.config)]
            server = Service("floor", argv, logdir=workdir, env=env, cwd=REPO)
        else:
            server = Service("api", [*broker_argv(), "--config", str(broker.config), "api"],
                             logdir=workdir, env=env, cwd=workdir)  # fmt: skip
        await server.start()
        await wait_http(server, port)
        conn = await db.connect(url)
        probe = Probe(port, conn, await db.consumer_pks(conn))
        kinds = args.kinds.split(",")
        results: dict[str, list[float]] = {k: [] for k in kinds}
        for kind in kinds:  # warm-up: caches, prepared statements, the pool
            await probe.run(server.pid, kind, max(50, args.requests // 10), args.concurrency)
        for _ in range(args.repeat):
            for kind in kinds:
                results[kind].append(
                    await probe.run(server.pid, kind, args.requests, args.concurrency, args.pyspy)
                )
        await conn.close()
        label = "floor" if args.floor else "api"
        for kind, values in results.items():
            shown = " / ".join(f"{v:.0f}" for v in values)
            print(f"{label} {kind}: {statistics.median(values):.0f} µs ({shown})", flush=True)
    finally:
        if server is not None:
            await server.stop()
        await asyncio.to_thread(cluster.stop)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work dir: {workdir}")


REPO = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.api_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--kinds", default=",".join(KINDS), help="comma separated: " + ",".join(KINDS))
    p.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--floor", action="store_true", help="the bare floor (bench/floor.py)")
    p.add_argument(
        "--pyspy", type=Path, help="py-spy each measurement into DIR/<kind>.txt (raw stacks)"
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
