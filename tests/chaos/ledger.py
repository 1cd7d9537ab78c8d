"""The invariants a chaos run must keep, checked from the database and from the clients' own
journal once everything has drained. Each check is counted; each violation names the job or
message and carries the timeline around it, so that the seed can be replayed and read."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.chaos.journal import JobKey, Journal
from tests.chaos.processes import Exit
from tests.chaos.workload import (
    CHANNEL,
    DOOMED_CONSUMER,
    HTTP_CONSUMER,
    NATS_CONSUMER,
    PAYLOAD_MARK,
    PUSH_CONSUMER,
)

SURVIVORS = (HTTP_CONSUMER, NATS_CONSUMER, PUSH_CONSUMER)
PULLED = (HTTP_CONSUMER, NATS_CONSUMER)
FINAL = ("DELIVERED", "DEAD")


@dataclass(frozen=True)
class JobRow:
    consumer_id: str
    message_id: str
    status: str
    attempt: int


@dataclass
class Ledger:
    journal: Journal
    checks: Counter[str] = field(default_factory=Counter)
    violations: list[dict[str, Any]] = field(default_factory=list)

    def check(self, name: str, ok: bool, subject: str, detail: str, at: float | None) -> None:
        self.checks[name] += 1
        if not ok:
            context = self.journal.around(at) if at is not None else []
            self.violations.append(
                {"invariant": name, "subject": subject, "detail": detail, "around": context}
            )

    # -- from the database ----------------------------------------------------------------

    def messages_and_jobs(self, jobs: list[JobRow], stored: set[str]) -> None:
        """Every publish that got 201 (or a 409 naming the message an earlier try stored) has
        its message, and every stored message exactly one job per consumer (none of the
        consumer deleted mid-run)."""
        per_message: dict[str, Counter[str]] = {}
        for row in jobs:
            per_message.setdefault(row.message_id, Counter())[row.consumer_id] += 1
        for message_id, outcome in self.journal.published.items():
            if outcome in ("created", "exists"):
                self.check(
                    "published message stored", message_id in stored, message_id, outcome, None
                )
            if outcome.startswith("refused"):
                self.check("valid publish accepted", False, message_id, outcome, None)
        for message_id in stored:
            counts = per_message.get(message_id, Counter())
            wanted = Counter(dict.fromkeys(SURVIVORS, 1))
            self.check(
                "one job per consumer",
                counts == wanted,
                message_id,
                f"jobs per consumer {dict(counts)}",
                None,
            )

    def final_states(self, jobs: list[JobRow]) -> None:
        for row in jobs:
            self.check(
                "every job DELIVERED or DEAD",
                row.status in FINAL,
                f"{row.consumer_id}/{row.message_id}",
                f"{row.status} at attempt {row.attempt}",
                self._last_seen((row.consumer_id, row.message_id)),
            )

    def deliveries(self, jobs: list[JobRow]) -> None:
        """A job is completed only by its last attempt, one a worker (or the receiver, which
        said 200) was handed; no worker saw an attempt the database does not know; a
        completion the broker confirmed (HTTP 202) is the job's end: no later attempt, the
        status it asked for."""
        for row in jobs:
            key = (row.consumer_id, row.message_id)
            receipts = self.journal.receipts.get(key, [])
            subject = f"{row.consumer_id}/{row.message_id}"
            at = self._last_seen(key)
            attempts = [r.attempt for r in receipts]
            self.check(
                "no attempt unknown to the database",
                max(attempts, default=0) <= row.attempt,
                subject,
                f"attempts seen {attempts}, database attempt {row.attempt}",
                at,
            )
            if row.status == "DELIVERED" and row.consumer_id in PULLED:
                self.check(
                    "DELIVERED by an attempt a worker was handed",
                    row.attempt in attempts,
                    subject,
                    f"attempts seen {attempts}, delivered at attempt {row.attempt}",
                    at,
                )
            if row.status == "DELIVERED" and row.consumer_id == PUSH_CONSUMER:
                answered = [r.attempt for r in receipts if r.answer == 200]
                self.check(
                    "DELIVERED by a push the receiver answered 200",
                    row.attempt in answered,
                    subject,
                    f"attempts answered 200 {answered}, delivered at attempt {row.attempt}",
                    at,
                )
            completions = self.journal.completions.get(key, [])
            if not completions:
                continue
            self.check(
                "at most one confirmed completion",
                len(completions) == 1,
                subject,
                f"completions {completions}",
                at,
            )
            done = completions[0]
            wanted = "DELIVERED" if done.kind == "ack" else "DEAD"
            self.check(
                "a confirmed completion is the job's end",
                (row.status, row.attempt) == (wanted, done.attempt)
                and all(r.attempt <= done.attempt for r in receipts),
                subject,
                f"{done.kind} of attempt {done.attempt} confirmed at {done.at}; "
                f"database {row.status} at attempt {row.attempt}; attempts seen {attempts}",
                done.at,
            )

    def dead_letters(self, jobs: list[JobRow], dlq_status: dict[str, Any]) -> None:
        dead = Counter(row.consumer_id for row in jobs if row.status == "DEAD")
        reported = {
            c["consumerId"]: c["deadCount"]
            for c in dlq_status["consumers"]
            if c["channelId"] == CHANNEL
        }
        for consumer_id in SURVIVORS:
            self.check(
                "DLQ count equals DEAD rows",
                reported.get(consumer_id, 0) == dead[consumer_id],
                consumer_id,
                f"/dlq-status {reported.get(consumer_id, 0)}, DEAD rows {dead[consumer_id]}",
                None,
            )

    def status_counts(self, jobs: list[JobRow], job_status: dict[str, Any]) -> None:
        counted = Counter((row.consumer_id, row.status) for row in jobs)
        reported = {
            (consumer_id, entry["status"]): entry["count"]
            for consumer_id, entries in job_status.get(CHANNEL, {}).items()
            for entry in entries
            if entry["count"]
        }
        self.check(
            "/job-status equals the rows",
            reported == dict(counted),
            CHANNEL,
            f"/job-status {reported}, rows {dict(counted)}",
            None,
        )

    def answers(self) -> None:
        """A fault makes a request one to retry (503, or no answer), never a server error."""
        for kind, count in self.journal.operations.items():
            status = kind.rpartition(" answered ")[2]
            if status.isdigit():
                self.check(
                    "no 5xx but 503",
                    not (500 <= int(status) < 600 and status != "503"),
                    kind,
                    f"{count} times",
                    None,
                )

    def leases_after_exit(self, inflight: int) -> None:
        self.check(
            "no job leased after every process exited cleanly",
            inflight == 0,
            "job",
            f"{inflight} INFLIGHT",
            None,
        )

    def exits(self, exits: list[Exit]) -> None:
        for gone in exits:
            if gone.how == "killed":
                continue
            self.check(
                "every process not killed exited 0",
                gone.code == 0,
                gone.process,
                f"{gone.how}: exit code {gone.code} after {gone.seconds}s",
                None,
            )

    def metrics(self, process: str, status: int, text: str) -> None:
        self.check(
            "every process serves /metrics",
            status == 200 and "webhook_broker_" in text,
            process,
            f"answered {status}",
            None,
        )
        if status != 200:
            return
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "webhook_broker_ledger_unaccounted_jobs":
                    self.check(
                        "the delivery ledger on /metrics adds up",
                        sample.value == 0,
                        f"{process} {sample.labels.get('consumer')}",
                        f"{sample.value:+.0f} jobs unaccounted",
                        None,
                    )

    def logs(self, logs: dict[str, str], secrets: list[str]) -> None:
        """No log line of any process shows a token, the signing secret or a payload."""
        for process, text in logs.items():
            for secret in [*secrets, PAYLOAD_MARK]:
                self.check(
                    "no token, secret or payload in a log",
                    secret not in text,
                    process,
                    f"shows {secret[:12]}...",
                    None,
                )

    def _last_seen(self, key: JobKey) -> float | None:
        receipts = self.journal.receipts.get(key)
        return receipts[-1].at if receipts else None


def read_jobs(url: str) -> tuple[list[JobRow], set[str], int]:
    """Every job of the channel (consumer id, message id, status, attempt), the stored message
    ids, and the jobs of deleted consumers (which must not exist)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.consumer_id, m.message_id, j.status, j.attempt FROM job j"
            " JOIN message m ON m.pk = j.message_pk JOIN consumer c ON c.pk = j.consumer_pk"
            " WHERE m.channel_id = %s",
            (CHANNEL,),
        ).fetchall()
        stored = {
            r[0]
            for r in conn.execute(
                "SELECT message_id FROM message WHERE channel_id = %s", (CHANNEL,)
            ).fetchall()
        }
        orphans = conn.execute(
            "SELECT count(*) FROM job WHERE consumer_pk NOT IN (SELECT pk FROM consumer)"
        ).fetchone()
    jobs = [JobRow(*row) for row in rows]
    assert orphans is not None
    return jobs, stored, int(orphans[0]) + sum(1 for j in jobs if j.consumer_id == DOOMED_CONSUMER)


def unfinished(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM job WHERE status NOT IN ('DELIVERED', 'DEAD')"
        ).fetchone()
    assert row is not None
    return int(row[0])


def inflight(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM job WHERE status = 'INFLIGHT'").fetchone()
    assert row is not None
    return int(row[0])


def archive_partition(url: str) -> tuple[str, list[JobRow]] | None:
    """What `webhook-broker pipeline archive` does before the broker drops a job partition, in
    one transaction: the rows of the oldest closed partition holding only delivered jobs, read
    (locked against change) and kept as the archive, and the partition marked EXPORTED. None:
    no partition is ready yet."""
    with psycopg.connect(url) as conn:
        names = conn.execute(
            "SELECT name FROM job_partition WHERE status = 'ATTACHED' AND closed_at IS NOT NULL"
            " ORDER BY upper_id"
        ).fetchall()
        for (name,) in names:
            rows = conn.execute(
                "SELECT c.consumer_id, m.message_id, j.status, j.attempt"
                f" FROM {name} j JOIN consumer c ON c.pk = j.consumer_pk"
                " JOIN message m ON m.pk = j.message_pk FOR SHARE OF j"
            ).fetchall()
            if not rows or any(row[2] != "DELIVERED" for row in rows):
                conn.rollback()
                continue
            conn.execute(
                "UPDATE job_partition SET status = 'EXPORTED', exported_rows = %s,"
                " changed_at = now() WHERE name = %s AND status = 'ATTACHED'",
                (len(rows), name),
            )
            conn.commit()
            return name, [JobRow(*row) for row in rows]
    return None


def partition_states(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, status FROM job_partition").fetchall())
