"""A throwaway PostgreSQL cluster (initdb into a temp dir, an unused port), and `free_port`.

The benchmarks (bench/) and the test suite (tests/conftest.py, the chaos suite) both start it;
it lives here so that neither imports the other. It is tuned for throughput
(bigger shared buffers) and loads pg_stat_statements, so every run can say which statements
each scenario issued.
fsync and synchronous_commit are off unless `durable` is set: the pgbench ceiling runs on the
same cluster with the same settings, so the ratios stay fair either way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bindir() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise RuntimeError("PostgreSQL server binaries not found; install Debian's postgresql")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """initdb refuses to run as root, so as root the cluster runs as the `postgres` user."""

    def __init__(
        self, *, durable: bool = False, shared_buffers: str = "1GB", statements: bool = True
    ) -> None:
        self.bindir = pg_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="wb-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.durable = durable
        self.shared_buffers = shared_buffers
        self.statements = statements
        self._as_root = os.geteuid() == 0
        self.started = False
        self._options = ""

    def _run(self, *args: str, timeout: float = 120) -> None:
        command = list(args)
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        if self._as_root:
            shutil.chown(self.root, "postgres")
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )
        settings = {
            "listen_addresses": "127.0.0.1",
            "max_connections": "400",
            "shared_buffers": self.shared_buffers,
            "max_wal_size": "4GB",
            "checkpoint_timeout": "15min",
        }
        if self.statements:
            settings |= {
                "shared_preload_libraries": "pg_stat_statements",
                "pg_stat_statements.track_utility": "on",
                "pg_stat_statements.track_planning": "on",
                # Room for every text a bench or load test runs (the default 5,000 evicts the
                # least-called entries, the console's reads among them, and restarts their counts).
                "pg_stat_statements.max": "20000",
            }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        self._options = f"-p {self.port} -k {self.root} " + " ".join(
            f"-c {key}={value}" for key, value in settings.items()
        )
        self.up()

    def up(self) -> None:
        """Start the server (again, after `down`) and wait until it accepts connections."""
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            self._options,
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        self.started = True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("PostgreSQL did not start listening")

    def standby(self) -> Cluster:
        """A streaming replica of this (started) cluster: a second throwaway cluster made by
        `pg_basebackup -R` (the primary's own settings, standby.signal and primary_conninfo),
        started, and returned once its WAL receiver streams (asked of the replica itself, so
        no name needs to match on the primary). initdb's trust rules already let 127.0.0.1
        connect for replication; wal_level and max_wal_senders are the defaults'."""
        from devtools.replica import standby_of  # it builds on this module

        return standby_of(self.base_url)

    def wait_streaming(self, timeout: float = 60) -> None:
        """Until this standby's WAL receiver reports streaming (after `standby`, or `up`)."""
        import psycopg

        deadline = time.monotonic() + timeout
        status: object = None
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.base_url, autocommit=True, connect_timeout=5) as conn:
                    row = conn.execute(
                        "SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver)"
                    ).fetchone()
                if row is not None and row[0] and row[1] == "streaming":
                    return
                status = row
            except psycopg.OperationalError as exc:  # still starting: not accepting yet
                status = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"the standby did not start streaming (last: {status!r})")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def down(self) -> None:
        """Stop the server as a crash would (immediate: no checkpoint, clients cut off); the
        data stays for `up`. The chaos suite's database outages."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        try:
            if self.started:
                self._run(
                    str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"
                )
        finally:
            self.started = False
            shutil.rmtree(self.root, ignore_errors=True)
