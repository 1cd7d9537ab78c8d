"""Entry point: `webhook-broker pipeline archive|report|all`, `python -m app.pipeline ...`, or
`spark-submit app/pipeline/job.py ...`. Owns the SparkSession and the run's advisory lock.

Exit codes: 0 done, 1 failed, 2 bad configuration, 75 another run holds the lock (try later).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import psycopg
from pyspark.sql import SparkSession

from app import priority
from app.config import Config, ConfigError, load_config
from app.domain.replica import ReadFrom
from app.logging import warn_ignored_keys
from app.pipeline.archive import Archiver, StepHook
from app.pipeline.db import LockMode, PipelineLocked, connect, jdbc_target, pipeline_lock
from app.pipeline.partitions import MessagePartitionArchiver, PartitionArchiver, PartitionHook
from app.pipeline.progress import Progress, summary_line
from app.pipeline.replica import ExportReads, report_source
from app.pipeline.report import Reporter
from app.pipeline.spark import build_session
from app.pipeline.state import BatchStore

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_LOCKED = 75  # EX_TEMPFAIL: another archiver is running
COMMANDS = ("archive", "report", "all")

# Called with the database the report is about to read (tests act between choice and reads).
SourceHook = Callable[[ReadFrom], None]


def build_parser(prog: str = "webhook-broker pipeline") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Archive finished work to Parquet and report delivery analytics."
    )
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--config", help="config file, read after the default locations")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's or local[*])")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: count what archive would take, compute the report without writing",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _finish(
            {"command": args.command, "status": "config_error", "error": str(exc)},
            EXIT_CONFIG,
            time.monotonic(),
            sys.stdout,
        )
    warn_ignored_keys(config)
    niceness = apply_niceness(config.pipeline.niceness, Progress())
    summary = run(args.command, config, master=args.master, dry_run=args.dry_run, niceness=niceness)
    return int(summary["exit_code"])


def apply_niceness(wanted: int, progress: Progress) -> int:
    """Raise this process's nice value to [pipeline] niceness (before Spark's JVM starts: it
    inherits it); the value it has now. Done by the command line only, never by `run`, which
    tests and embedders call in processes of their own."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if wanted > current:
        os.nice(wanted - current)
        current = os.getpriority(os.PRIO_PROCESS, 0)
    if wanted or current:
        # Lowering it back needs privileges an archive should not have: said, not attempted.
        note = "" if current == wanted else f" ([pipeline] niceness {wanted}: already nicer)"
        progress.line(f"running at niceness {current}{note}")
    if wanted and priority.autogroups_on():
        _nice_session(wanted, progress)
    return current


def _nice_session(wanted: int, progress: Progress) -> None:
    """Under scheduler autogroups a nice value orders this process only within its session
    (app/priority.py): in a session this process leads (setsid, a supervisor), the session's
    own value is raised too; a session it does not lead belongs to whoever started it, and is
    left alone with a line saying what to do."""
    group = priority.autogroup_nice()  # None in the root autogroup (init's session)
    if group is not None and group >= wanted:
        return
    if os.getsid(0) != os.getpid():
        progress.line(
            f"niceness {wanted} orders this process only within the session that started it "
            "(scheduler autogroups): start the archive in a session of its own (setsid) for "
            "it to yield to the broker"
        )
    elif priority.nice_autogroup(wanted):
        progress.line(f"session (autogroup) at niceness {wanted}")
    else:
        progress.line(f"could not set this session's autogroup niceness to {wanted}")


def run(
    command: str,
    config: Config,
    *,
    master: str | None = None,
    dry_run: bool = False,
    spark: SparkSession | None = None,
    hook: StepHook | None = None,
    partition_hook: PartitionHook | None = None,
    source_hook: SourceHook | None = None,
    wait_hook: Callable[[str], None] | None = None,
    niceness: int | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> dict[str, Any]:
    """One pipeline run; prints one JSON summary line to `out` and returns it as a dict.
    `wait_hook` is called when an export starts waiting for the replica (with what it
    exports); `niceness`, the process's as main set it, goes into the summary."""
    started = time.monotonic()
    summary: dict[str, Any] = {"command": command, "dry_run": dry_run}
    if niceness is not None:
        summary["niceness"] = niceness
    progress = Progress(err)
    try:
        if command not in COMMANDS:
            raise ConfigError(f"unknown pipeline command {command!r}")
        if config.database.dialect != "postgresql":
            raise ConfigError("[rdbms] dialect: the pipeline needs postgresql")
        url = config.database.connection_url
        # Readers share the lock; an archiver needs it alone.
        mode: LockMode = "exclusive" if command != "report" and not dry_run else "shared"
        with pipeline_lock(url, mode):
            summary.update(
                _run_locked(
                    command,
                    config,
                    master,
                    dry_run,
                    spark,
                    (hook, partition_hook, source_hook, wait_hook),
                    progress,
                )
            )
        code = EXIT_OK
        summary["status"] = "ok"
    except PipelineLocked as exc:
        progress.line(str(exc))
        summary.update(status="locked", error=str(exc))
        code = EXIT_LOCKED
    except ConfigError as exc:
        progress.line(f"bad configuration: {exc}")
        summary.update(status="config_error", error=str(exc))
        code = EXIT_CONFIG
    except Exception as exc:
        progress.line("failed:\n" + traceback.format_exc())
        # A JVM error's text carries its whole stack trace: the summary keeps the first line.
        first = (str(exc).strip().splitlines() or [""])[0]
        summary.update(status="failed", error=f"{type(exc).__name__}: {first[:500]}")
        code = EXIT_FAILED
    _finish(summary, code, started, out or sys.stdout)
    return summary


def _finish(summary: dict[str, Any], code: int, started: float, out: TextIO) -> int:
    summary["event"] = "webhook_broker_pipeline"
    summary["exit_code"] = code
    summary["seconds"] = round(time.monotonic() - started, 3)
    print(summary_line(summary), file=out, flush=True)
    return code


def _run_locked(
    command: str,
    config: Config,
    master: str | None,
    dry_run: bool,
    spark: SparkSession | None,
    hooks: tuple[
        StepHook | None, PartitionHook | None, SourceHook | None, Callable[[str], None] | None
    ],
    progress: Progress,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    pipeline = config.pipeline
    jdbc = jdbc_target(config.database.connection_url)
    hook, partition_hook, source_hook, wait_hook = hooks
    # The exports read the replica when one is configured and has caught up (replica.py).
    reads = ExportReads(config.database, pipeline.replica_wait_seconds, progress, on_wait=wait_hook)
    # With partitions rotating, jobs leave with their partition (app/pipeline/partitions.py)
    # and the batches take only messages no job refers to any more: no statuses count as
    # finished, so a message with any job left is not planned. A message partition nothing
    # points into leaves whole too, and the batches leave its messages alone (state.py).
    by_partition = config.database.partition_interval_seconds > 0
    with connect(config.database.connection_url) as conn:
        store = BatchStore(conn, () if by_partition else pipeline.terminal_statuses)
        if dry_run and command in ("archive", "all"):
            messages, jobs = store.eligible(pipeline.retention_days)
            unfinished = [{"id": b.id, "status": b.status} for b in store.unfinished()]
            progress.line(f"dry run: {messages} messages, {jobs} jobs would be archived")
            result["archive"] = {
                "eligible_messages": messages,
                "eligible_jobs": jobs,
                "unfinished_batches": unfinished,
            }
            if by_partition:
                result.update(_partition_plan(config, reads, conn, progress))
                # As the run would: batches wait while a job partition is on its way out,
                # those this run would mark included.
                waits = store.partitions_in_flight() + [
                    p["partition"] for p in result["partitions"]["would_export"]
                ]
                if waits:
                    result["archive"]["batches_wait_for"] = waits
                    progress.line(
                        f"dry run: message batches would wait for the broker to drop"
                        f" {', '.join(waits)}"
                    )
            if command == "archive":
                return result
        owned = spark is None
        session = spark or build_session(pipeline, master)
        try:
            if command in ("archive", "all") and not dry_run and by_partition:
                # Message partitions first: a job partition marked below counts as pointing
                # into every message partition until the broker has dropped it.
                whole = MessagePartitionArchiver(
                    session, pipeline, reads, conn, progress, partition_hook
                )
                result["message_partitions"] = whole.run().as_dict()
                parts = PartitionArchiver(session, pipeline, reads, conn, progress, partition_hook)
                result["partitions"] = parts.run().as_dict()
            waiting = store.partitions_in_flight() if by_partition else []
            if command in ("archive", "all") and not dry_run and waiting:
                progress.line(f"message batches wait for the broker to drop {', '.join(waiting)}")
            elif command in ("archive", "all") and not dry_run:
                archiver = Archiver(session, pipeline, reads, conn, store, progress, hook)
                result["archive"] = archiver.run().as_dict()
            if command in ("report", "all"):
                primary = Reporter(session, pipeline, jdbc, conn, store, progress)
                report = _report_on_replica(session, config, progress, dry_run, source_hook)
                result["report"] = report or primary.run(write=not dry_run).as_dict()
        finally:
            if owned:
                session.stop()
    return result


def _partition_plan(
    config: Config, reads: ExportReads, conn: psycopg.Connection[Any], progress: Progress
) -> dict[str, Any]:
    """The partitions an archive run would export whole now, message partitions first as the
    run takes them; nothing written or marked (and no Spark started)."""
    return {
        "message_partitions": MessagePartitionArchiver(
            None, config.pipeline, reads, conn, progress
        ).plan(),
        "partitions": PartitionArchiver(None, config.pipeline, reads, conn, progress).plan(),
    }


def _report_on_replica(
    session: SparkSession,
    config: Config,
    progress: Progress,
    dry_run: bool,
    source_hook: SourceHook | None,
) -> dict[str, Any] | None:
    """The report read from the replica when it is fresh enough (measured now, under the lock
    and after this run's archive step); None: the primary is to be read instead."""
    source = report_source(config.database)
    if config.database.replica is not None:
        progress.line(f"report reads the {source.read_from.value}: {source.why}")
    if source_hook is not None:
        source_hook(source.read_from)
    if source.read_from is not ReadFrom.REPLICA:
        return None
    try:
        with connect(source.connection_url) as conn:
            # Reads only: the batch states as the replica has them, matching its live rows.
            store = BatchStore(conn, ())
            jdbc = jdbc_target(source.connection_url)
            reporter = Reporter(
                session, config.pipeline, jdbc, conn, store, progress, ReadFrom.REPLICA
            )
            return reporter.run(write=not dry_run).as_dict()
    except Exception as exc:
        # As the API does with a read the replica fails (it went down, a query cancelled by a
        # recovery conflict): the primary answers, the report saying so.
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        progress.line(
            f"the replica failed the report's reads ({type(exc).__name__}: {first});"
            " reading the primary"
        )
        return None


if __name__ == "__main__":
    sys.exit(main())
