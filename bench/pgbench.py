"""The database ceiling: pgbench running the broker's own claim, ack and publish statements.

The statements are those app/store/jobs.py and app/store/messages.py issue (as SQLAlchemy
renders them for psycopg: statuses and numbers are bind parameters, the same columns come
back), run with `-M prepared` as psycopg does after a few executions. Statuses and the batch
size are written into the claim and ack texts, as the broker's statements (app/store/queue.py) write
them: with them as parameters a generic plan cannot use the partial claim index or price the
LIMIT, so PostgreSQL planned every statement anew, a cost the broker no longer pays.

What the ceiling leaves out is the broker's overhead, on purpose: credential lookups, the
per-pull queue statistics, BEGIN/COMMIT round trips and the pool's pre-ping. Each claim is ONE
statement that also reads the claimed jobs' messages, as the broker's hot claim is.

Scripts:
  claim      claim `batch` jobs (+ their messages)
  batch_ack  claim, then one ack UPDATE naming every (id, attempt)
  each_ack   claim, then one ack UPDATE per job
  publish    one message + fan-out INSERT ... SELECT to the channel's consumers + NOTIFY
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loadgen import percentiles

CLAIM = (
    "UPDATE job SET status='INFLIGHT', attempt=(job.attempt + :one::INTEGER), "
    "incremental_timeout=:zero::INTEGER, "
    "lease_expires_at=(now() + CAST(:ack_wait AS FLOAT) * interval '1 second'), "
    "claimed_at=now(), status_changed_at=now() "
    "WHERE job.id IN (SELECT job.id FROM job WHERE job.consumer_pk = :cpk::BIGINT "
    "AND job.status = 'QUEUED' AND job.earliest_next_attempt_at <= now() "
    "ORDER BY job.priority DESC, job.id LIMIT {batch} FOR UPDATE SKIP LOCKED) "
    "AND job.status = 'QUEUED' RETURNING job.*"
)

ACK = (
    "UPDATE job SET status='DELIVERED', lease_expires_at=NULL::TIMESTAMP WITH TIME ZONE, "
    "status_changed_at=now() WHERE job.consumer_pk = :cpk::BIGINT "
    "AND job.status = 'INFLIGHT' AND (job.id, job.attempt) IN ({pairs}) RETURNING job.*"
)

PUBLISH = [
    "BEGIN;",
    "INSERT INTO message (channel_id, message_id, producer_id, payload, content_type, priority, "
    "headers, received_at) VALUES (:pub_channel::VARCHAR, "
    "replace(gen_random_uuid()::text, '-', '')::VARCHAR, :producer::VARCHAR, "
    "convert_to(:payload, 'UTF8'), :ctype::VARCHAR, :zero::INTEGER, :headers::JSON, now()) "
    "RETURNING message.pk AS mpk, message.channel_id, message.message_id, message.producer_id, "
    "message.payload, message.content_type, message.priority, message.headers, "
    # A prefix, so the returned columns (payload, ...) do not overwrite the -D variables.
    "message.received_at \\gset r_",
    "INSERT INTO job (message_pk, consumer_pk, status, priority, payload_size, "
    "earliest_next_attempt_at, status_changed_at, created_at) "
    "SELECT :r_mpk::BIGINT, consumer.pk, :st_q::VARCHAR, :zero::INTEGER, :psize::INTEGER, now(), "
    "now(), now() FROM consumer WHERE consumer.channel_id = :pub_channel::VARCHAR "
    "RETURNING job.consumer_pk;",
    "SELECT pg_notify(:notify_channel, :notify_payload);",
    "COMMIT;",
]

SCRIPTS = ("claim", "batch_ack", "each_ack", "publish")
JOBS_COUNTED_BY = {
    "claim": "claimed",
    "batch_ack": "delivered",
    "each_ack": "delivered",
    "publish": "created",
}


def claim_command(batch: int, with_ids: bool) -> str:
    """The claim, plus one row (for \\gset) with the claimed rows and their messages as text."""
    columns = [
        "coalesce(agg.job_rows, '') AS job_rows",
        "coalesce((SELECT array_agg(m.*)::text FROM message AS m WHERE m.pk IN "
        "(SELECT claimed.message_pk FROM claimed)), '') AS message_rows",
    ]
    if with_ids:
        for k in range(1, batch + 1):
            columns.append(f"coalesce(agg.ids[{k}], 0) AS i{k}")
            columns.append(f"coalesce(agg.atts[{k}], 0) AS a{k}")
    return (
        f"WITH claimed AS ({CLAIM.format(batch=batch)}), "
        "agg AS (SELECT array_agg(c.id ORDER BY c.id) AS ids, "
        "array_agg(c.attempt ORDER BY c.id) AS atts, array_agg(c.*)::text AS job_rows "
        f"FROM claimed AS c) SELECT {', '.join(columns)} FROM agg \\gset"
    )


def script_text(name: str, batch: int) -> str:
    if name == "claim":
        lines = [claim_command(batch, with_ids=False)]
    elif name == "batch_ack":
        pairs = ", ".join(f"(:i{k}, :a{k})" for k in range(1, batch + 1))
        lines = [claim_command(batch, with_ids=True), ACK.format(pairs=pairs) + ";"]
    elif name == "each_ack":
        lines = [claim_command(batch, with_ids=True)]
        lines += [ACK.format(pairs=f"(:i{k}, :a{k})") + ";" for k in range(1, batch + 1)]
    elif name == "publish":
        lines = list(PUBLISH)
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
