"""One chaos run: PostgreSQL and nats-server, two of each broker process, the workload, the
fault schedule, a drain, a clean stop of everything, and the invariants. The summary is one
line on stdout and a JSON file; a violation carries the seed and the events around it.

    python -m tests.chaos --seconds 1800 --seed 7 --out chaos-summary.json
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from devtools.pg import Cluster, free_port
from tests.chaos import ledger
from tests.chaos.faults import Faults
from tests.chaos.journal import Journal
from tests.chaos.processes import BrokerProcess
from tests.chaos.workload import (
    ACK_WAIT_SECONDS,
    CHANNEL,
    CHANNEL_TOKEN,
    DOOMED_CONSUMER,
    HTTP_CONSUMER,
    NATS_CONSUMER,
    PRODUCER,
    PRODUCER_TOKEN,
    PUSH_CONSUMER,
    Apis,
    HttpPuller,
    NatsPuller,
    Phase,
    Publisher,
    PushReceiver,
    token,
)
from tests.helpers.natsproc import NatsServer
from tests.helpers.waiting import eventually

ACK_PREFIX = "$WB.ACK"
KINDS = ("api", "sweeper", "dispatcher", "bridge")


@dataclass(frozen=True)
class Settings:
    seconds: float
    seed: int
    publishers: int = 2
    per_second: float = 10.0  # each publisher's rate
    fault_gap: tuple[float, float] = (2.0, 6.0)
    drain_seconds: float = 120.0
    out: Path | None = None


def broker_config(db_url: str, nats_url: str) -> str:
    return f"""
[rdbms]
dialect=postgresql
connection-url={db_url}
max-open-connxns=8
max-idle-connxns=4
partition-interval=10s
[pipeline]
retention-days=0
[http]
write-timeout=10
[broker]
max-retry=4
rational-delay-in-seconds=1
retry-backoff-delays-in-seconds=1
[consumer-connection]
connection-timeout-in-seconds=1
[push]
retry-after-max-seconds=2
breaker-failures=20
breaker-cooldown=2
[nats]
mode=client
url={nats_url}
ack-prefix={ACK_PREFIX}
"""


def broker_process(kind: str, n: int, config: Path, api_port: int) -> BrokerProcess:
    """As compose runs them: an API on its port (its /metrics there), any other kind with
    its metrics on a port of its own ([metrics] listener)."""
    if kind == "api":
        listen = {"WEBHOOK_BROKER__HTTP__LISTENER": f"127.0.0.1:{api_port}"}
        metrics = f"http://127.0.0.1:{api_port}/metrics"
    else:
        port = free_port()
        listen = {"WEBHOOK_BROKER__METRICS__LISTENER": f"127.0.0.1:{port}"}
        metrics = f"http://127.0.0.1:{port}/metrics"
    return BrokerProcess(f"{kind}{n}", kind, config, listen, metrics)


async def ready(apis: Apis, within: float = 60) -> None:
    deadline = time.monotonic() + within
    for client in apis.clients:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/_ready")).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{client.base_url} not ready")
            await asyncio.sleep(0.2)


async def setup(http: httpx.AsyncClient, hook_url: str) -> list[str]:
    """The channel, its producer and consumers; the secrets no log may show (the tokens and
    the push consumer's signing secret, which its PUT answers with)."""
    answers: list[str] = []

    async def put(path: str, **form: str) -> None:
        r = await http.put(path, data=form)
        assert r.status_code == 200, r.text
        answers.append(r.text)

    await put(f"/channel/{CHANNEL}", token=CHANNEL_TOKEN)
    await put(f"/producer/{PRODUCER}", token=PRODUCER_TOKEN)
    for consumer_id in (HTTP_CONSUMER, NATS_CONSUMER, DOOMED_CONSUMER):
        await put(
            f"/channel/{CHANNEL}/consumer/{consumer_id}",
            token=token(consumer_id),
            type="pull",
            ackWait=str(ACK_WAIT_SECONDS),
        )
    await put(
        f"/channel/{CHANNEL}/consumer/{PUSH_CONSUMER}",
        token=token(PUSH_CONSUMER),
        callbackUrl=hook_url,
    )
    signing = re.findall(r"whsec_[A-Za-z0-9+/=]+", answers[-1])
    assert signing, answers[-1]
    consumers = (HTTP_CONSUMER, NATS_CONSUMER, DOOMED_CONSUMER, PUSH_CONSUMER)
    return [CHANNEL_TOKEN, PRODUCER_TOKEN, *map(token, consumers), *signing]


async def run(settings: Settings) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="wb-chaos-"))
    # Durable: an immediate stop loses no commit (without fsync and synchronous commit a
    # publish answered 201 can vanish in a restart, as on any such server).
    cluster = Cluster(durable=True, shared_buffers="128MB", statements=False)
    nats_server = NatsServer()
    await asyncio.to_thread(cluster.start)
    try:
        nats_server.start()
        return await _run(settings, root, cluster, nats_server)
    finally:
        nats_server.cleanup()
        await asyncio.to_thread(cluster.stop)
        shutil.rmtree(root, ignore_errors=True)


async def _run(
    settings: Settings, root: Path, cluster: Cluster, nats_server: NatsServer
) -> dict[str, Any]:
    rng = random.Random(settings.seed)
    with psycopg.connect(cluster.base_url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE chaos")
    db_url = cluster.url("chaos")
    config = root / "webhook-broker.cfg"
    config.write_text(broker_config(db_url, nats_server.url))
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", "--config", str(config), "migrate"],
        check=True,
        capture_output=True,
        cwd=root,
        timeout=120,
    )
    ports = [free_port(), free_port()]
    processes = [broker_process(kind, n, config, ports[n]) for kind in KINDS for n in range(2)]
    for process in processes:
        process.start()
    journal = Journal()
    phase = Phase()
    receiver = PushReceiver(journal, phase, settings.seed)
    await receiver.start()
    clients = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=15) for port in ports]
    try:
        apis = Apis(clients)
        await ready(apis)
        secrets = await setup(clients[0], receiver.url)
        archived: list[ledger.JobRow] = []  # the jobs of partitions archived and dropped
        summary = await _drive(
            settings, rng, journal, phase, apis, processes, cluster, nats_server, archived
        )
        summary.update(await _verify(settings, journal, apis, processes, db_url, secrets, archived))
    finally:
        phase.stopped = True
        for process in processes:
            if process.running():
                await asyncio.to_thread(process.kill)
        for client in clients:
            await client.aclose()
        await receiver.stop()
    if summary["violations"]:
        logs = (settings.out or Path("chaos-summary.json")).with_suffix(".logs")
        shutil.copytree(root, logs, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock"))
        summary["logs"] = str(logs)
    return summary


async def _drive(
    settings: Settings,
    rng: random.Random,
    journal: Journal,
    phase: Phase,
    apis: Apis,
    processes: list[BrokerProcess],
    cluster: Cluster,
    nats_server: NatsServer,
    archived: list[ledger.JobRow],
) -> dict[str, Any]:
    def child() -> random.Random:
        return random.Random(rng.getrandbits(64))

    async def archive_partition() -> bool:
        try:
            done = await asyncio.to_thread(ledger.archive_partition, cluster.url("chaos"))
        except psycopg.Error as error:  # the database may be down (a fault)
            journal.event("partition-drop", f"not now: {type(error).__name__}")
            return False
        if done is None:
            return False
        name, rows = done
        archived.extend(rows)
        journal.event("fault", f"partition-drop {name} ({len(rows)} jobs archived)")
        return True

    async def delete_doomed() -> None:
        for attempt in range(20):
            with contextlib.suppress(httpx.TransportError):
                path = f"/channel/{CHANNEL}/consumer/{DOOMED_CONSUMER}"
                got = await apis.request("GET", path)
                if got.status_code == 404:
                    return
                since = {"If-Unmodified-Since": got.headers.get("Last-Modified", "")}
                r = await apis.request("DELETE", path, headers=since)
                journal.event("consumer-delete", f"answered {r.status_code}")
                if r.status_code in (204, 404):
                    return
            await asyncio.sleep(0.5 + attempt * 0.1)
        journal.event("consumer-delete", "gave up")

    clients = [
        *(
            Publisher(n, apis, journal, phase, child(), settings.per_second).run()
            for n in range(settings.publishers)
        ),
        *(HttpPuller(HTTP_CONSUMER, apis, journal, phase, child()).run() for _ in range(2)),
        HttpPuller(DOOMED_CONSUMER, apis, journal, phase, child()).run(),
        *(
            NatsPuller(n, nats_server.url, ACK_PREFIX, journal, phase, child()).run()
            for n in range(2)
        ),
    ]
    tasks = [asyncio.create_task(c) for c in clients]
    monitor = asyncio.create_task(_monitor(journal, processes, phase))
    faults = Faults(
        child(),
        journal,
        processes,
        cluster,
        nats_server,
        delete_doomed,
        settings.fault_gap,
        archive_partition=archive_partition,
    )
    await faults.run(
        until=settings.seconds, delete_at=settings.seconds * 0.4, drop_at=settings.seconds * 0.5
    )
    # The drain: no more publishing or misbehaving; every process up; the work completes.
    phase.publishing = False
    phase.draining = True
    journal.event("phase", "drain")
    for process in processes:
        process.resume()
    left = -1

    async def drained() -> bool:
        nonlocal left
        left = await asyncio.to_thread(ledger.unfinished, cluster.url("chaos"))
        return left == 0

    # Not drained in time is a finding of the report, not an error here.
    with contextlib.suppress(AssertionError):
        await eventually(drained, settings.drain_seconds, 1.0, what="every job finished")
    journal.event("phase", f"drained ({left} unfinished)")
    phase.stopped = True
    done, pending = await asyncio.wait(tasks, timeout=20)
    for task in pending:
        task.cancel()
    for task in done:
        if task.exception() is not None:
            journal.event("client failed", repr(task.exception()))
            journal.operations["client failures"] += 1
    monitor.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await monitor
    return {"drain": {"unfinished": left}}


async def _monitor(journal: Journal, processes: list[BrokerProcess], phase: Phase) -> None:
    """A process that exits on its own is recorded (a violation) and started again."""
    while not phase.stopped:
        for process in processes:
            gone = process.check()
            if gone is not None:
                journal.event("crash", f"{process.name} exit code {gone.code}")
                process.start()
        await asyncio.sleep(0.5)


async def _verify(
    settings: Settings,
    journal: Journal,
    apis: Apis,
    processes: list[BrokerProcess],
    db_url: str,
    secrets: list[str],
    archived: list[ledger.JobRow],
) -> dict[str, Any]:
    book = ledger.Ledger(journal)
    status = await apis.request("GET", "/job-status")
    dlq = await apis.request("GET", "/dlq-status")
    async with httpx.AsyncClient(timeout=10) as http:
        for process in processes:
            # As Prometheus would: a scrape that meets the first use of a connection the
            # database dropped in a restart gets a 503, and the next one is served.
            answers: list[httpx.Response] = []

            async def scraped(
                process: BrokerProcess = process, answers: list[httpx.Response] = answers
            ) -> bool:
                answers.append(await http.get(process.metrics_url))
                return answers[-1].status_code != 503

            # Three tries a second apart; the last answer is recorded, 503 or not.
            with contextlib.suppress(AssertionError):
                await eventually(scraped, 2, 1.0, what=f"{process.name} scraped")
            book.metrics(process.name, answers[-1].status_code, answers[-1].text)
    exits = await asyncio.gather(*(asyncio.to_thread(p.stop) for p in processes))
    for gone in exits:
        journal.event("exit", f"{gone.process} {gone.code} after {gone.seconds}s")
    jobs, stored, deleted_jobs = await asyncio.to_thread(ledger.read_jobs, db_url)
    # The jobs of a dropped partition are in the archive: each message's jobs are those left
    # and those archived; the status counts are the table's.
    everything = jobs + archived
    states = await asyncio.to_thread(ledger.partition_states, db_url)
    for name, state in states.items():
        if state != "ATTACHED":
            book.check("an archived partition dropped", state == "DROPPED", name, state, None)
    book.messages_and_jobs(everything, stored)
    book.check(
        "no job of the deleted consumer",
        deleted_jobs == 0,
        DOOMED_CONSUMER,
        str(deleted_jobs),
        None,
    )
    book.final_states(everything)
    book.deliveries(everything)
    book.dead_letters(jobs, dlq.json())
    book.status_counts(jobs, status.json())
    book.answers()
    book.leases_after_exit(await asyncio.to_thread(ledger.inflight, db_url))
    book.exits([e for p in processes for e in p.exits])
    book.logs({p.name: p.log.read_text(errors="replace") for p in processes}, secrets)
    statuses: dict[str, int] = {}
    for row in jobs:
        statuses[row.status] = statuses.get(row.status, 0) + 1
    return {
        "seed": settings.seed,
        "seconds": settings.seconds,
        "messages": len(stored),
        "jobs": statuses,
        "operations": sum(journal.operations.values()),
        "operations by kind": dict(sorted(journal.operations.items())),
        "faults": dict(sorted(journal.faults.items())),
        "process starts": {p.name: p.starts for p in processes},
        "invariant checks": sum(book.checks.values()),
        "checks by invariant": dict(book.checks),
        "violations": book.violations,
        "events": journal.events,
    }


def summary_line(summary: dict[str, Any]) -> str:
    faults = ", ".join(f"{kind} {n}" for kind, n in summary["faults"].items())
    return (
        f"chaos seed={summary['seed']} {summary['seconds']:.0f}s: "
        f"{summary['operations']} operations, {summary['messages']} messages, "
        f"faults: {sum(summary['faults'].values())} ({faults}), "
        f"{summary['invariant checks']} invariant checks, "
        f"violations: {len(summary['violations'])}"
    )


def write(summary: dict[str, Any], out: Path) -> None:
    out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
