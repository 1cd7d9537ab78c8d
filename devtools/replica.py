"""A streaming replica of any running PostgreSQL reachable by URL: a second throwaway cluster
made by `pg_basebackup -R`, started (optionally under `nice`), returned once it streams.

Cluster.standby is this, for a cluster this process started; the benchmarks' scenarios are
handed only the primary's address (bench/retention.py), which is all this needs. The replica
runs with the primary's command-line settings (read from its pg_settings: a hot standby must
have at least the primary's max_connections, and the same statistics library), its own port
and socket directory, and any `settings` given on top.
"""

from __future__ import annotations

import shlex
import shutil
from urllib.parse import urlsplit

import psycopg

from app.priority import autogroups_on, nice_autogroup
from devtools.pg import Cluster

# The primary's own address: the replica gets its own.
_PER_SERVER = ("port", "unix_socket_directories", "listen_addresses")


class _Standby(Cluster):
    """A Cluster whose server commands run under `nice -n <niceness>` (the postmaster and
    every backend it forks inherit it)."""

    niceness = 0

    def _run(self, *args: str, timeout: float = 120) -> None:
        if self.niceness:
            args = ("nice", "-n", str(self.niceness), *args)
        super()._run(*args, timeout=timeout)


def standby_of(
    primary_url: str, *, niceness: int = 0, settings: dict[str, str] | None = None
) -> Cluster:
    """A started, streaming replica of the server at `primary_url` (trust auth on 127.0.0.1,
    as devtools' clusters have it). `stop()` removes it; the primary is left as it was."""
    parts = urlsplit(primary_url)
    with psycopg.connect(primary_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings"
            " WHERE source = 'command line' ORDER BY name"
        ).fetchall()
    inherited = {str(name): str(value) for name, value in rows if name not in _PER_SERVER}
    chosen = {**inherited, "listen_addresses": "127.0.0.1", **(settings or {})}
    replica = _Standby(statements=False)
    replica.niceness = niceness
    if replica._as_root:
        shutil.chown(replica.root, "postgres")
    replica._run(
        str(replica.bindir / "pg_basebackup"),
        "-D",
        str(replica.data),
        "-h",
        parts.hostname or "127.0.0.1",
        "-p",
        str(parts.port or 5432),
        "-U",
        parts.username or "postgres",
        "-R",
        "-X",
        "stream",
        "-c",
        "fast",
        "--no-sync",
        timeout=1800,
    )
    replica._options = f"-p {replica.port} -k {replica.root} " + " ".join(
        f"-c {key}={shlex.quote(value)}" for key, value in chosen.items()
    )
    replica.up()
    if niceness and autogroups_on():
        # pg_ctl starts the postmaster in a session of its own, where its nice value alone
        # would order it only against its own backends (app/priority.py).
        nice_autogroup(niceness, replica.postmaster_pid())
    replica.wait_streaming()
    return replica
