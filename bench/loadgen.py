"""Load generator process: `python -m bench.loadgen '<json spec>'`.

Runs ONE scenario's clients in a process of its own (never inside the broker), on uvloop when
it is installed. Protocol on stdout, one JSON object per line:
  {"event": "measure_start"}   the warm-up is over; the orchestrator snapshots CPU and the DB clock
  {"event": "measure_end"}     the measured window is over; clients stop issuing new requests
  {"event": "result", ...}     client-side observations (latencies, statuses); jobs are counted
                               from the database by the orchestrator, not from these numbers
Every loop is bounded by the spec's warm-up + duration (or a fixed number of requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.http1 import Connection, HttpError

Spec = dict[str, Any]


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


@dataclass
class Window:
    """Warm-up, then the measured window; requests started inside it are the ones that count."""

    warmup: float
    duration: float
    start: float = field(default_factory=time.perf_counter)

    @property
    def measure_start(self) -> float:
        return self.start + self.warmup

    @property
    def end(self) -> float:
        return self.start + self.warmup + self.duration

    def running(self) -> bool:
        return time.perf_counter() < self.end

    def measured(self, at: float) -> bool:
        return self.measure_start <= at < self.end

    async def announce(self) -> None:
        await asyncio.sleep(max(0.0, self.measure_start - time.perf_counter()))
        emit("measure_start")
        await asyncio.sleep(max(0.0, self.end - time.perf_counter()))
        emit("measure_end")


@dataclass
class Recorder:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def latency(self, name: str, seconds: float) -> None:
        self.latencies.setdefault(name, []).append(seconds * 1000.0)

    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text)
        self.counts["errors"] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "latency_ms": {name: percentiles(values) for name, values in self.latencies.items()},
            "statuses": dict(self.statuses),
            "counts": dict(self.counts),
            "errors": self.errors,
        }


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {
        "n": len(ordered),
        "p50": pick(0.50),
        "p90": pick(0.90),
        "p99": pick(0.99),
        "max": round(ordered[-1], 3),
        "mean": round(sum(ordered) / len(ordered), 3),
    }


def consumer_headers(spec: Spec) -> dict[str, str]:
    return {
        "X-Broker-Channel-Token": spec["channel_token"],
        "X-Broker-Consumer-Token": spec["consumer_token"],
    }


def producer_headers(spec: Spec) -> dict[str, str]:
    return {
        "X-Broker-Channel-Token": spec["channel_token"],
        "X-Broker-Producer-ID": spec["producer"],
        "X-Broker-Producer-Token": spec["producer_token"],
        "Content-Type": "application/json",
    }


def consumer_base(spec: Spec) -> str:
    return f"/channel/{spec['channel']}/consumer/{spec['consumer']}"


async def timed(
    rec: Recorder, window: Window | None, name: str, call: Callable[[], Awaitable[Any]]
) -> Any:
    started = time.perf_counter()
    result = await call()
    if window is None or window.measured(started):
        rec.latency(name, time.perf_counter() - started)
    return result


# -- HTTP pull + ack ------------------------------------------------------------------------------


async def pull_worker(spec: Spec, port: int, window: Window, rec: Recorder) -> None:
    """pull(batch) then ack: one batch ack, one POST per job, or none; until the window ends
    (or after `pulls` pulls, the first `warmup_pulls` of them unmeasured)."""
    conn = Connection(port)
    base = consumer_base(spec)
    headers = consumer_headers(spec)
    # `terms`: priority group fields (an overflow consumer's pulls).
    body = {"batch": spec["batch"], "expires": spec.get("expires", 1.0), **spec.get("terms", {})}
    mode = spec["ack"]
    pulls_left = spec.get("pulls")
    warmup_pulls = spec.get("warmup_pulls", 0)
    done = 0
    try:
        while window.running() and (pulls_left is None or done < pulls_left + warmup_pulls):
            started = time.perf_counter()
            response = await conn.post_json(f"{base}/pull", body, headers)
            measured = window.measured(started) and done >= warmup_pulls
            done += 1
            if measured:
                rec.latency("pull", time.perf_counter() - started)
            rec.statuses[f"pull {response.status}"] += 1
            if response.status != 200:
                rec.error(f"pull {response.status}: {response.body[:200]!r}")
                await asyncio.sleep(0.05)
                continue
            jobs = response.json()["Jobs"]
            rec.counts["jobs pulled"] += len(jobs)
            if not jobs:
                rec.counts["empty pulls"] += 1
                continue
            if mode == "batch":
                acks = [{"id": j["ID"], "attempt": j["Attempt"], "type": "ack"} for j in jobs]
                started = time.perf_counter()
                response = await conn.post_json(f"{base}/ack", {"acks": acks}, headers)
                if measured:
                    rec.latency("ack", time.perf_counter() - started)
                rec.statuses[f"ack {response.status}"] += 1
                if response.status == 200:
                    for result in response.json()["Results"]:
                        rec.statuses[f"ack item {result['status']}"] += 1
            elif mode == "each":
                for j in jobs:
                    started = time.perf_counter()
                    response = await conn.post_json(
                        f"{base}/job/{j['ID']}/ack", {"attempt": j["Attempt"]}, headers
                    )
                    if window.measured(started):
                        rec.latency("ack", time.perf_counter() - started)
                    rec.statuses[f"ack {response.status}"] += 1
    except HttpError as exc:
        rec.error(str(exc))
    finally:
        await conn.close()


# -- the client's consume() ------------------------------------------------------------------------


async def consume_worker(spec: Spec, window: Window, rec: Recorder) -> None:
    """The client's consume() with a handler that acks each job itself, as a worker would;
    the acks of concurrent handlers are coalesced by the client into batch acks."""
    from webhook_broker_client import Broker, Job

    async with Broker(f"http://127.0.0.1:{spec['ports'][0]}") as broker:
        consumer = broker.consumer(
            spec["channel"],
            spec["consumer"],
            channel_token=spec["channel_token"],
            consumer_token=spec["consumer_token"],
        )

        async def handle(job: Job) -> None:
            await job.ack()
            rec.counts["acked"] += 1

        context = consumer.consume(
            handle,
            max_messages=spec["max_messages"],
            concurrency=spec["concurrency"],
            auto_ack=False,
            error_callback=lambda error: rec.error(repr(error)),
        )
        await window.announce()
        await context.stop()


# -- HTTP publish ---------------------------------------------------------------------------------


async def publish_worker(spec: Spec, port: int, window: Window, rec: Recorder) -> None:
    conn = Connection(port)
    headers = {
        "X-Broker-Channel-Token": spec["channel_token"],
        "X-Broker-Producer-ID": spec["producer"],
        "X-Broker-Producer-Token": spec["producer_token"],
        "Content-Type": "application/json",
    }
    payload = spec["payload"].encode()
    path = f"/channel/{spec['channel']}/broadcast"
    try:
        while window.running():
            started = time.perf_counter()
            response = await conn.request("POST", path, headers, payload)
            if window.measured(started):
                rec.latency("publish", time.perf_counter() - started)
            rec.statuses[f"publish {response.status}"] += 1
            if response.status != 201:
                rec.error(f"publish {response.status}: {response.body[:200]!r}")
                await asyncio.sleep(0.05)
    except HttpError as exc:
        rec.error(str(exc))
    finally:
        await conn.close()


# -- the Go original's protocol -------------------------------------------------------------------


async def goproto_worker(spec: Spec, port: int, window: Window, rec: Recorder) -> None:
    """List queued jobs, then POST INFLIGHT and DELIVERED for each, as a webhook-broker client."""
    conn = Connection(port)
    base = consumer_base(spec)
    headers = consumer_headers(spec)
    limit = spec["limit"]
    try:
        while window.running():
            started = time.perf_counter()
            response = await conn.request("GET", f"{base}/queued-jobs?limit={limit}", headers)
            measured = window.measured(started)
            if measured:
                rec.latency("list", time.perf_counter() - started)
            if response.status != 200:
                rec.error(f"list {response.status}: {response.body[:200]!r}")
                await asyncio.sleep(0.05)
                continue
            jobs = response.json()["Result"]
            rec.counts["jobs listed"] += len(jobs)
            if not jobs:
                rec.counts["empty lists"] += 1
                await asyncio.sleep(0.01)
                continue
            for j in jobs:
                if not window.running():
                    break
                path = f"{base}/job/{j['ID']}"
                for state in ("INFLIGHT", "DELIVERED"):
                    started = time.perf_counter()
                    response = await conn.post_json(path, {"NextState": state}, headers)
                    if window.measured(started):
                        rec.latency("transition", time.perf_counter() - started)
                    rec.statuses[f"{state} {response.status}"] += 1
                    if response.status != 202:
                        break
    except HttpError as exc:
        rec.error(str(exc))
    finally:
        await conn.close()


# -- long-poll wake-up and idle long-pollers ------------------------------------------------------


async def wakeup(spec: Spec, rec: Recorder) -> None:
    """One waiting pull, then a publish: latency from the publish being sent to the job arriving.

    With several API processes, puller and publisher alternate between them so the wake-up
    crosses processes (PostgreSQL NOTIFY) as well as staying in one (local events).
    """
    ports: list[int] = spec["ports"]
    pullers = [Connection(p) for p in ports]
    publishers = [Connection(p) for p in ports]
    pull_headers = consumer_headers(spec)
    pub_headers = producer_headers(spec)
    base = consumer_base(spec)
    total = spec["samples"] + spec["warmup_samples"]
    emit("measure_start")
    try:
        for i in range(total):
            puller = pullers[i % len(ports)]
            publisher = publishers[(i + (1 if i % 2 else 0)) % len(ports)]
            kind = "same process" if puller.port == publisher.port else "cross process"
            pull = asyncio.create_task(
                puller.post_json(f"{base}/pull", {"batch": 1, "expires": 10.0}, pull_headers)
            )
            await asyncio.sleep(spec["settle"])
            if pull.done():
                rec.error(f"pull returned before the publish: {(await pull).status}")
                continue
            sent = time.perf_counter()
            published = await publisher.request(
                "POST", f"/channel/{spec['channel']}/broadcast", pub_headers, b'{"n": %d}' % i
            )
            published_at = time.perf_counter()
            response = await pull
            arrived = time.perf_counter()
            if published.status != 201 or response.status != 200:
                rec.error(f"publish {published.status} / pull {response.status}")
                continue
            jobs = response.json()["Jobs"]
            if not jobs:
                rec.error("the waiting pull expired empty")
                continue
            if i >= spec["warmup_samples"]:
                rec.latency("wakeup", arrived - sent)
                rec.latency(f"wakeup {kind}", arrived - sent)
                rec.latency("publish", published_at - sent)
            acks = [{"id": j["ID"], "attempt": j["Attempt"]} for j in jobs]
            await puller.post_json(f"{base}/ack", {"acks": acks}, pull_headers)
    except HttpError as exc:
        rec.error(str(exc))
    finally:
        for conn in pullers + publishers:
            await conn.close()
    emit("measure_end")


async def stream_wakeup(spec: Spec, rec: Recorder) -> None:
    """The same publishes as `wakeup`, to a streaming pull that stays open: latency from the
    publish being sent to its job's line arriving (publishes alternate between the API
    processes, the stream stays on the first)."""
    import httpx

    ports: list[int] = spec["ports"]
    publishers = [Connection(p) for p in ports]
    pub_headers = producer_headers(spec)
    base = consumer_base(spec)
    total = spec["samples"] + spec["warmup_samples"]
    arrivals: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
    body = {"stream": True, "batch": total, "expires": 300, "idle_heartbeat": 5}
    emit("measure_start")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", timeout=30) as http:

        async def read() -> None:
            async with http.stream(
                "POST", f"{base}/pull", json=body, headers=consumer_headers(spec)
            ) as response:
                async for line in response.aiter_lines():
                    event = json.loads(line)
                    if "Job" in event:
                        arrivals.put_nowait((time.perf_counter(), event["Job"]))

        reader = asyncio.create_task(read())
        try:
            await asyncio.sleep(spec["settle"])
            for i in range(total):
                publisher = publishers[i % len(ports)]
                kind = "same process" if publisher.port == ports[0] else "cross process"
                sent = time.perf_counter()
                published = await publisher.request(
                    "POST", f"/channel/{spec['channel']}/broadcast", pub_headers, b'{"n": %d}' % i
                )
                if published.status != 201:
                    rec.error(f"publish {published.status}")
                    continue
                arrived, job = await asyncio.wait_for(arrivals.get(), 10)
                if i >= spec["warmup_samples"]:
                    rec.latency("wakeup", arrived - sent)
                    rec.latency(f"wakeup {kind}", arrived - sent)
                acks = [{"id": job["ID"], "attempt": job["Attempt"]}]
                await publisher.post_json(f"{base}/ack", {"acks": acks}, consumer_headers(spec))
                await asyncio.sleep(spec["settle"])
        except (HttpError, TimeoutError) as exc:
            rec.error(repr(exc))
        finally:
            reader.cancel()
            for conn in publishers:
                await conn.close()
    emit("measure_end")


async def idle_pollers(spec: Spec, window: Window, rec: Recorder) -> None:
    """`pollers` long polls that wait on an empty queue for the whole window."""
    ports: list[int] = spec["ports"]
    base = consumer_base(spec)
    headers = consumer_headers(spec)
    expires = spec["warmup"] + spec["duration"] + 1.0

    async def one(i: int) -> None:
        conn = Connection(ports[i % len(ports)])
        try:
            while window.running():
                response = await conn.post_json(
                    f"{base}/pull", {"batch": 1, "expires": expires}, headers
                )
                rec.statuses[f"pull {response.status}"] += 1
                if response.status != 200:
                    rec.error(f"pull {response.status}: {response.body[:200]!r}")
                    break
        except HttpError as exc:
            rec.error(str(exc))
        finally:
            await conn.close()

    await asyncio.gather(window.announce(), *(one(i) for i in range(spec["pollers"])))


# -- NATS JetStream (the real server, or the bridge) ---------------------------------------------


async def jetstream_worker(spec: Spec, window: Window, rec: Recorder) -> None:
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    nc = await nats.connect(spec["nats_url"], allow_reconnect=False)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe_bind(durable=spec["durable"], stream=spec["stream"])
        while window.running():
            started = time.perf_counter()
            try:
                msgs = await sub.fetch(spec["batch"], timeout=spec.get("fetch_timeout", 1.0))
            except NatsTimeout:
                rec.counts["empty fetches"] += 1
                continue
            if window.measured(started):
                rec.latency("fetch", time.perf_counter() - started)
            rec.counts["messages fetched"] += len(msgs)
            for msg in msgs:
                await msg.ack()
        await nc.flush()
    except Exception as exc:  # a bridge under construction may fail in any way: report it
        rec.error(f"{type(exc).__name__}: {exc}")
    finally:
        await nc.close()


# -- pgqueuer -------------------------------------------------------------------------------------


async def pgqueuer_enqueue(spec: Spec, window: Window, rec: Recorder) -> None:
    import psycopg
    from pgqueuer import Queries
    from pgqueuer.db import PsycopgDriver

    payload = spec["payload"].encode()

    async def one() -> None:
        conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True)
        try:
            queries = Queries(PsycopgDriver(conn))
            while window.running():
                await timed(rec, window, "enqueue", lambda: queries.enqueue("bench", payload))
        finally:
            await conn.close()

    await asyncio.gather(window.announce(), *(one() for _ in range(spec["workers"])))


async def pgqueuer_dequeue(spec: Spec, window: Window, rec: Recorder) -> None:
    """`workers` QueueManagers, each on its own connection, running a no-op entrypoint."""
    from datetime import timedelta

    import psycopg
    from pgqueuer import Job, Queries, QueueManager
    from pgqueuer.db import PsycopgDriver

    managers: list[QueueManager] = []

    async def one() -> None:
        conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True)
        manager = QueueManager(Queries(PsycopgDriver(conn)))
        managers.append(manager)

        @manager.entrypoint("bench")
        async def handle(job: Job) -> None:
            rec.counts["jobs handled"] += 1

        try:
            await manager.run(dequeue_timeout=timedelta(seconds=1), batch_size=spec["batch"])
        finally:
            await conn.close()

    async def stopper() -> None:
        await window.announce()
        for manager in managers:
            manager.shutdown.set()

    await asyncio.gather(stopper(), *(one() for _ in range(spec["workers"])))


async def pgqueuer_mixed(spec: Spec, window: Window, rec: Recorder) -> None:
    """pgqueuer the way its own tools/benchmark.py runs it by default: enqueuers adding
    batches while QueueManagers dequeue in small batches, at the same time."""
    import psycopg
    from pgqueuer import Queries
    from pgqueuer.db import PsycopgDriver

    payload = spec["payload"].encode()
    size = spec["enqueue_batch"]

    async def enqueuer() -> None:
        conn = await psycopg.AsyncConnection.connect(spec["dsn"], autocommit=True)
        try:
            queries = Queries(PsycopgDriver(conn))
            while window.running():
                await queries.enqueue(["bench"] * size, [payload] * size, [0] * size)
        finally:
            await conn.close()

    dequeue = dict(spec, workers=spec["dequeue_workers"], batch=spec["dequeue_batch"])
    await asyncio.gather(
        pgqueuer_dequeue(dequeue, window, rec),
        *(enqueuer() for _ in range(spec["enqueue_workers"])),
    )


# -- entry point ----------------------------------------------------------------------------------


async def run(spec: Spec) -> dict[str, Any]:
    rec = Recorder()
    mode = spec["mode"]
    if mode == "wakeup":
        await (stream_wakeup if spec.get("stream") else wakeup)(spec, rec)
        return rec.summary()
    window = Window(spec.get("warmup", 0.0), spec.get("duration", 0.0))
    ports: list[int] = spec.get("ports", [])
    workers = spec.get("workers", 1)
    if mode in ("pull", "publish", "goproto"):
        worker = {"pull": pull_worker, "publish": publish_worker, "goproto": goproto_worker}[mode]
        clients = [worker(spec, ports[i % len(ports)], window, rec) for i in range(workers)]
        if spec.get("pulls"):
            # A fixed number of pulls (claim latency): the window is only an upper bound.
            emit("measure_start")
            await asyncio.gather(*clients)
            emit("measure_end")
        else:
            await asyncio.gather(window.announce(), *clients)
    elif mode == "idle":
        await idle_pollers(spec, window, rec)
    elif mode == "consume":
        await consume_worker(spec, window, rec)
    elif mode == "jetstream":
        await asyncio.gather(
            window.announce(), *(jetstream_worker(spec, window, rec) for _ in range(workers))
        )
    elif mode == "pgqueuer_enqueue":
        await pgqueuer_enqueue(spec, window, rec)
    elif mode == "pgqueuer_dequeue":
        await pgqueuer_dequeue(spec, window, rec)
    elif mode == "pgqueuer_mixed":
        await pgqueuer_mixed(spec, window, rec)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return rec.summary()


def main() -> None:
    spec: Spec = json.loads(sys.argv[1])
    runner: Callable[[Any], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    result = runner(run(spec))
    emit("result", **result)


if __name__ == "__main__":
    main()
