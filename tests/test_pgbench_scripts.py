"""The benchmark's database ceiling runs the broker's own statements (bench/pgbench.py loads
them from app/store/queue.py): each pgbench script, run a few times by the real pgbench
against a migrated database, claims, acks and publishes what the broker's statements would."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from app.runtime import Runtime
from bench.db import payload
from bench.pgbench import script_defines, script_text
from devtools.pg import pg_bindir
from tests.helpers.pull import (
    CHANNEL,
    CHANNEL_TOKEN,
    PRODUCER,
    PRODUCER_TOKEN,
    consumer_pk,
    publish,
    setup_channel,
)

BATCH = 3


async def run_script(rt: Runtime, tmp_path: Path, script: str, times: int) -> str:
    pk = await consumer_pk(rt, "k1")
    path = tmp_path / f"{script}.sql"
    path.write_text(script_text(script, BATCH))
    url = rt.config.database.connection_url
    argv = [str(pg_bindir() / "pgbench"), "-n", "-M", "prepared", "-t", str(times), "-f", str(path)]
    defines = script_defines(
        consumer_pk=pk,
        ack_wait=30,
        channel=CHANNEL,
        channel_token=rt.tokens.digest(CHANNEL_TOKEN),
        producer=PRODUCER,
        producer_token=rt.tokens.digest(PRODUCER_TOKEN),
        payload=payload(100),
    )
    for key, value in defines.items():
        argv += ["-D", f"{key}={value}"]
    proc = await asyncio.create_subprocess_exec(
        *argv, url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    output = out.decode(errors="replace")
    assert proc.returncode == 0, output
    return output


async def statuses(rt: Runtime) -> dict[str, int]:
    async with rt.db.transaction() as tx:
        rows = await tx.conn.execute(text("SELECT status, count(*) FROM job GROUP BY status"))
        return {status: n for status, n in rows.all()}


# Eight messages to two consumers: k1 and k2 have eight queued jobs each; each script runs
# twice for k1 (a claim takes BATCH = 3 jobs), and a publish gives both a job.
@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("claim", {"INFLIGHT": 6, "QUEUED": 10}),
        ("batch_ack", {"DELIVERED": 6, "QUEUED": 10}),
        ("each_ack", {"DELIVERED": 6, "QUEUED": 10}),
        ("publish", {"QUEUED": 20}),
    ],
)
async def test_each_script_does_what_the_broker_statement_does(
    client: httpx.AsyncClient,
    runtime: Runtime,
    tmp_path: Path,
    script: str,
    expected: dict[str, int],
) -> None:
    await setup_channel(client, "k1", "k2")
    for n in range(8):
        await publish(client, f"m{n}")
    await run_script(runtime, tmp_path, script, times=2)
    assert await statuses(runtime) == expected
