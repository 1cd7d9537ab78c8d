"""[pipeline] niceness (issue 42): parsed and bounded (0..19), and applied by the command line
at its start, in its own process (the Spark JVM, started later, is its child and inherits it),
which the run's summary and its first progress line report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest

from app.config import Config, ConfigError, load_config_text
from app.pipeline.db import PIPELINE_LOCK_KEY
from app.pipeline.job import EXIT_LOCKED
from app.priority import autogroup_nice, autogroups_on
from tests.helpers.waiting import eventually_sync


@pytest.mark.parametrize("raw", ["-1", "20", "low"])
def test_niceness_outside_0_to_19_is_refused_with_its_reason(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"\[pipeline\] niceness"):
        load_config_text(f"[pipeline]\nniceness={raw}\n")


def test_niceness_is_read_and_defaults_to_0() -> None:
    assert load_config_text("").pipeline.niceness == 0
    assert load_config_text("[pipeline]\nniceness=19\n").pipeline.niceness == 19


def test_the_pipeline_process_runs_at_the_configured_niceness(
    pipeline: Config, tmp_path: Path
) -> None:
    wanted = os.getpriority(os.PRIO_PROCESS, 0) + 7
    assert wanted <= 19
    cfg = tmp_path / "webhook-broker.cfg"
    cfg.write_text(
        f"[rdbms]\ndialect=postgresql\nconnection-url={pipeline.database.connection_url}\n"
        f"[pipeline]\narchive-root={tmp_path / 'archive'}\nniceness={wanted}\n"
    )
    url = pipeline.database.connection_url
    with psycopg.connect(url, autocommit=True) as holder:
        # Another archiver holds the lock: this run stops before Spark, having set its niceness.
        holder.execute("SELECT pg_advisory_lock(%s)", (PIPELINE_LOCK_KEY,))
        done = subprocess.run(
            [sys.executable, "-m", "app.pipeline", "archive", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == EXIT_LOCKED, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["niceness"] == wanted  # os.getpriority, asked in that process
    assert f"running at niceness {wanted}" in done.stderr
    assert os.getpriority(os.PRIO_PROCESS, 0) == wanted - 7  # the test's own: untouched


def test_the_spark_jvm_inherits_the_niceness(pipeline: Config, tmp_path: Path) -> None:
    wanted = os.getpriority(os.PRIO_PROCESS, 0) + 5
    cfg = tmp_path / "webhook-broker.cfg"
    cfg.write_text(
        f"[rdbms]\ndialect=postgresql\nconnection-url={pipeline.database.connection_url}\n"
        f"[pipeline]\nreport-root={tmp_path / 'report'}\nniceness={wanted}\n"
    )
    command = [sys.executable, "-m", "app.pipeline", "report", "--dry-run"]
    run = subprocess.Popen(
        [*command, "--master", "local[1]", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:

        def jvm() -> psutil.Process | None:
            for child in psutil.Process(run.pid).children(recursive=True):
                try:
                    if child.name() == "java":
                        return child
                except psutil.NoSuchProcess:
                    continue
            return None

        found = eventually_sync(jvm, what="the pipeline's Spark JVM")
        assert found is not None and found.nice() == wanted
        out, _ = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, out
    assert json.loads(out.strip().splitlines()[-1])["niceness"] == wanted


def _locked_run(
    pipeline: Config, tmp_path: Path, wanted: int, *, own_session: bool
) -> tuple[subprocess.CompletedProcess[str], int | None]:
    """The pipeline started as `setsid` (or a supervisor) starts it, or as a child of this
    session; it stops at the lock, before Spark. What it said, and its autogroup's niceness as
    it left it (read by a child it starts: the session outlives it only through its members)."""
    cfg = tmp_path / "webhook-broker.cfg"
    cfg.write_text(
        f"[rdbms]\ndialect=postgresql\nconnection-url={pipeline.database.connection_url}\n"
        f"[pipeline]\narchive-root={tmp_path / 'archive'}\nniceness={wanted}\n"
    )
    # The pipeline's own process reads its autogroup at exit through a hook module: the
    # session it led is gone once it has exited.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import atexit, sys\n"
        "from app.priority import autogroup_nice\n"
        "atexit.register(lambda: print('autogroup', autogroup_nice(), file=sys.stderr))\n"
        "import runpy\n"
        "sys.argv = ['app.pipeline', *sys.argv[1:]]\n"
        "runpy.run_module('app.pipeline', run_name='__main__')\n"
    )
    with psycopg.connect(pipeline.database.connection_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (PIPELINE_LOCK_KEY,))
        done = subprocess.run(
            [sys.executable, str(probe), "archive", "--config", str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=own_session,
        )
    group = [line for line in done.stderr.splitlines() if line.startswith("autogroup ")]
    value = group[-1].split()[1] if group else "None"
    return done, None if value == "None" else int(value)


needs_autogroups = pytest.mark.skipif(
    not autogroups_on(), reason="the kernel's scheduler autogroups are off"
)


@needs_autogroups
def test_in_a_session_of_its_own_the_session_yields_too(pipeline: Config, tmp_path: Path) -> None:
    done, group = _locked_run(pipeline, tmp_path, 19, own_session=True)
    assert done.returncode == EXIT_LOCKED, done.stderr
    assert "session (autogroup) at niceness 19" in done.stderr
    assert group == 19


@needs_autogroups
def test_in_a_session_it_does_not_lead_the_session_is_left_alone(
    pipeline: Config, tmp_path: Path
) -> None:
    # None where this test runs in the root autogroup (init's session, as a CI runner may):
    # the kernel shows that group as an empty file. Either way, not 19.
    ours = autogroup_nice()
    assert ours is None or ours < 19
    done, group = _locked_run(pipeline, tmp_path, 19, own_session=False)
    assert done.returncode == EXIT_LOCKED, done.stderr
    assert "start the archive in a session of its own (setsid)" in done.stderr
    assert group == ours == autogroup_nice()
