"""The database ceiling: pgbench running the broker's own claim, ack and publish statements.

The texts are the broker's own, loaded from app/store/queue.py (the claim for a consumer named
by primary key, the batch and single acks, the publish with its fan-out and NOTIFY), with their
parameters turned into pgbench variables, run with `-M prepared` as psycopg runs them. Only
what pgbench cannot do is added around them: a unique message id per publish comes from the
server, and the claimed rows are folded into one row so that `\\gset` can hand their ids to
the acks.

What the ceiling leaves out is the broker's overhead, on purpose: HTTP, the credential check by
token (the pgbench consumers are named by primary key), the Python side of every round trip.

Scripts:
  claim      claim `batch` jobs (+ their messages)
  batch_ack  claim, then the batch ack naming every (id, attempt)
  each_ack   claim, then one single ack per job
  publish    one message + a job for each of the channel's consumers + NOTIFY
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.store.queue import ACK, PUBLISH, claim_sql
from bench.loadgen import percentiles


def pgbench_text(sql: str, **renamed: str) -> str:
    """A psycopg text as a pgbench command: each %(name)s becomes the variable :name (or the
    variable `renamed` gives it), on one line."""
    text = re.sub(r"%\((\w+)\)s", lambda m: ":" + renamed.get(m[1], m[1]), sql)
    text = text.replace("%%", "%")  # psycopg's escaped percent sign, SQL's modulo
    lines = [line.split("--", 1)[0].strip() for line in text.strip().splitlines()]
    return " ".join(line for line in lines if line)


def claim_command(batch: int, with_ids: bool) -> str:
    """The broker's claim, its rows folded into one row for \\gset: the claimed rows as text
    (so the server produces all the data a client would receive) and, for the acks, the ids
    and attempts (as arrays, and one by one as i1, a1, i2, a2 ...). The batch size is the
    variable :limit, a bind parameter under -M prepared as %(limit)s is in psycopg."""
    claim = claim_sql("pk", numbered=False, by_bytes=False, capped=False)
    head, final = claim.rsplit("\nSELECT ", 1)
    columns = ["coalesce(array_agg(out.*)::text, '') AS job_rows"]
    if with_ids:
        columns += [
            "coalesce(array_agg(out.id ORDER BY out.id), '{}')::text AS ids",
            "coalesce(array_agg(out.attempt ORDER BY out.id), '{}')::text AS attempts",
        ]
        for k in range(1, batch + 1):
            columns.append(f"coalesce((array_agg(out.id ORDER BY out.id))[{k}], 0) AS i{k}")
            columns.append(f"coalesce((array_agg(out.attempt ORDER BY out.id))[{k}], 0) AS a{k}")
    folded = f"{head}, out AS (\nSELECT {final}) SELECT {', '.join(columns)} FROM out"
    return f"\\set limit {int(batch)}\n" + pgbench_text(folded) + " \\gset"


def ack_command(one: int | None = None) -> str:
    """The batch ack (ids and attempts from the claim), or the single ack of job number `one`."""
    if one is None:
        return pgbench_text(ACK[("pk", False)]) + ";"
    return pgbench_text(ACK[("pk", True)], id=f"i{one}", attempt=f"a{one}") + ";"


def publish_command() -> str:
    unique = "replace(gen_random_uuid()::text, '-', '')"
    published_now = PUBLISH.replace("%(scheduled_for)s", "NULL")
    return pgbench_text(published_now.replace("%(message_id)s", unique)) + ";"


def script_defines(
    *,
    consumer_pk: int,
    ack_wait: int,
    channel: str,
    channel_token: str,
    producer: str,
    producer_token: str,
    payload: str,
) -> dict[str, str]:
    """The variables the scripts' statements read (their psycopg parameters' names)."""
    return {
        "consumer_pk": str(consumer_pk),
        "consumer_type": "pull",
        "default_ack_wait": str(ack_wait),
        "incremental_timeout": "0",
        "channel_id": channel,
        "channel_token": channel_token,
        "producer_id": producer,
        "producer_token": producer_token,
        "payload": payload,
        "payload_size": str(len(payload.encode())),
        "content_type": "application/json",
        "priority": "0",
        "headers": "{}",
    }


SCRIPTS = ("claim", "batch_ack", "each_ack", "publish")
JOBS_COUNTED_BY = {
    "claim": "claimed",
    "batch_ack": "delivered",
    "each_ack": "delivered",
    "publish": "created",
}


def script_text(name: str, batch: int) -> str:
    if name == "claim":
        lines = [claim_command(batch, with_ids=False)]
    elif name == "batch_ack":
        lines = [claim_command(batch, with_ids=True), ack_command()]
    elif name == "each_ack":
        lines = [claim_command(batch, with_ids=True)]
        lines += [ack_command(k) for k in range(1, batch + 1)]
    elif name == "publish":
        lines = [publish_command()]
    else:
        raise ValueError(name)
    return "\n".join(lines) + "\n"


def jobs_per_script(name: str, batch: int, fan_out: int) -> int:
    return fan_out if name == "publish" else batch


@dataclass
class PgbenchRun:
    script: str
    clients: int
    tps: float
    latency_ms: dict[str, float]
    launched_wall: float
    output: str
    failed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


async def run_pgbench(
    *,
    bindir: Path,
    port: int,
    dbname: str,
    workdir: Path,
    script: str,
    batch: int,
    clients: int,
    seconds: int,
    defines: dict[str, str],
    window: tuple[float, float],
) -> PgbenchRun:
    """Run one script for `seconds`; latencies are those of scripts ending inside `window`
    (offsets in seconds from the launch)."""
    path = workdir / f"pgbench-{script}.sql"
    path.write_text(script_text(script, batch))
    prefix = workdir / f"pgblog-{script}-{clients}-{time.monotonic_ns()}"
    argv = [
        str(bindir / "pgbench"),
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(seconds),
        "-f",
        str(path),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-U",
        "postgres",
        "-l",
        f"--log-prefix={prefix}",
    ]
    for key, value in defines.items():
        argv += ["-D", f"{key}={value}"]
    argv.append(dbname)
    launched = time.time()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=seconds + 120)
    output = out.decode(errors="replace")
    found = re.search(r"tps = ([0-9.]+)", output)
    latencies = _log_latencies(prefix, launched + window[0], launched + window[1])
    return PgbenchRun(
        script=script,
        clients=clients,
        tps=float(found.group(1)) if found else 0.0,
        latency_ms=latencies,
        launched_wall=launched,
        output=output[-1500:],
        failed=proc.returncode != 0,
    )


def _log_latencies(prefix: Path, start: float, end: float) -> dict[str, float]:
    """pgbench -l lines: client, transaction, latency (us), script, epoch seconds, epoch us."""
    values: list[float] = []
    for log in prefix.parent.glob(prefix.name + "*"):
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) < 6:
                continue
            finished = int(parts[4]) + int(parts[5]) / 1e6
            if start <= finished < end:
                values.append(int(parts[2]) / 1000.0)
        log.unlink()
    return percentiles(values)
