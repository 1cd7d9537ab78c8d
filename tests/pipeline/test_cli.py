"""The command line: one archiver at a time (exit 75), dry runs, the JSON summary line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from app.cli import main as cli_main
from app.config import Config
from app.pipeline.db import PIPELINE_LOCK_KEY, pipeline_lock
from app.pipeline.job import EXIT_LOCKED
from tests.pipeline import data
from tests.pipeline.helpers import batches, query


def _config_file(config: Config, tmp_path: Path) -> Path:
    p = config.pipeline
    path = tmp_path / "webhook-broker.cfg"
    path.write_text(
        "[rdbms]\ndialect=postgresql\n"
        f"connection-url={config.database.connection_url}\n"
        f"partition-interval={config.database.partition_interval_seconds or 'off'}\n"
        "[pipeline]\n"
        f"archive-root={p.archive_root}\nreport-root={p.report_root}\n"
        f"retention-days={p.retention_days}\nbatch-size={p.batch_size}\n"
    )
    return path


def _summary(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout
    summary: dict[str, object] = json.loads(lines[0])
    return summary


@pytest.mark.parametrize("command", ["archive", "all"])
def test_a_second_archiver_exits_with_the_locked_code(
    pipeline: Config, tmp_path: Path, command: str
) -> None:
    data.seed(pipeline.database.connection_url, old=3, old_open=0, recent=0)
    cfg = _config_file(pipeline, tmp_path)
    with psycopg.connect(pipeline.database.connection_url, autocommit=True) as holder:
        # The first archiver, as far as PostgreSQL can tell.
        holder.execute("SELECT pg_advisory_lock(%s)", (PIPELINE_LOCK_KEY,))
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "app.cli", "pipeline", command, "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == EXIT_LOCKED == 75, second.stderr
        assert time.monotonic() - started < 60  # refused at once, before Spark starts
        summary = _summary(second.stdout)
        assert summary["status"] == "locked" and summary["exit_code"] == 75
        # A report shares the lock with other readers but not with an archiver.
        report = subprocess.run(
            [sys.executable, "-m", "app.pipeline", "report", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.returncode == 75
    # Nothing was touched.
    assert batches(pipeline) == []
    assert query(pipeline, "SELECT count(*) AS n FROM message") == [{"n": 3}]


def test_dry_run_counts_and_changes_nothing(
    pipeline: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = data.seed(pipeline.database.connection_url)
    jobs = query(
        pipeline, "SELECT count(*) AS n FROM job WHERE message_pk = ANY(%s)", dataset.old_terminal
    )[0]["n"]
    cfg = _config_file(pipeline, tmp_path)

    code = cli_main(["pipeline", "archive", "--dry-run", "--config", str(cfg)])

    assert code == 0
    summary = _summary(capsys.readouterr().out)
    assert summary["archive"] == {
        "eligible_messages": len(dataset.old_terminal),
        "eligible_jobs": jobs,
        "unfinished_batches": [],
    }
    assert batches(pipeline) == []
    assert not Path(pipeline.pipeline.archive_root).exists()


def test_bad_configuration_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("[pipeline]\nterminal-statuses=QUEUED\n")
    assert cli_main(["pipeline", "archive", "--config", str(cfg)]) == 2
    assert "terminal-statuses" in str(_summary(capsys.readouterr().out)["error"])
    sqlite = tmp_path / "sqlite.cfg"
    sqlite.write_text("[rdbms]\ndialect=sqlite\nconnection-url=x.sqlite3\n")
    assert cli_main(["pipeline", "report", "--config", str(sqlite)]) == 2
    assert "postgresql" in str(_summary(capsys.readouterr().out)["error"])


def test_the_lock_is_free_as_soon_as_a_run_returns(pipeline: Config) -> None:
    """The next run (a report after a crashed archiver, say) finds the lock free at once: it
    must not have to race the previous run's backend to exit."""
    url = pipeline.database.connection_url

    def free() -> bool:
        row = next_run.execute("SELECT pg_try_advisory_lock(%s)", (PIPELINE_LOCK_KEY,)).fetchone()
        next_run.execute("SELECT pg_advisory_unlock_all()")
        return bool(row and row[0])

    with psycopg.connect(url, autocommit=True) as next_run:
        for mode in ("exclusive", "shared") * 20:
            with pipeline_lock(url, mode):
                assert not free()
            assert free(), mode
        with pytest.raises(RuntimeError), pipeline_lock(url, "exclusive"):
            raise RuntimeError("a run that crashes")
        assert free()
