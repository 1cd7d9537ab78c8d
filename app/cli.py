"""`webhook-broker`: one command per process type; each loads config and runs ONE process."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from webhook_broker_client.cli import (
    CLIENT_COMMANDS,
    EXIT_FAILED,
    add_client_commands,
    run_client_command,
)

from app.cli_nats import COMMAND as COMMAND_NATS_PERMISSIONS
from app.cli_nats import add_nats_permissions_command, run_nats_permissions
from app.config import Config, ConfigError, load_config
from app.logging import setup_logging, warn_ignored_keys, warn_open_access

if TYPE_CHECKING:
    from app.roots.process import Process

log = logging.getLogger("webhook_broker")

EXIT_CONFIG = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="webhook-broker", description=__doc__)
    parser.add_argument("--config", help="config file, read after the default locations")
    # `--config` after the command as well (`webhook-broker serve --config x.cfg`): given
    # there, it wins; not given there, the one before the command stays.
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("serve", "API + sweeper + push dispatcher in one process; migrates and seeds on start"),
        ("api", "the HTTP API only"),
        ("sweeper", "the requeue sweeper only"),
        ("dispatcher", "push delivery to callback URLs only"),
        ("migrate", "migrate the database to the newest schema and exit"),
        ("bridge", "the NATS bridge: JetStream pull clients take jobs ([nats])"),
    ):
        sub.add_parser(name, help=text, parents=[config])
    ledger = sub.add_parser(
        "ledger",
        help="every consumer's delivery ledger; --settle CHANNEL CONSUMER takes one's holdings"
        " as its new opening balance (after a mismatch was looked into)",
        parents=[config],
    )
    ledger.add_argument("--settle", nargs=2, metavar=("CHANNEL", "CONSUMER"))
    pipeline = sub.add_parser(
        "pipeline", help="Spark jobs: pipeline archive|report|all [--help]", add_help=False
    )
    pipeline.add_argument("pipeline_args", nargs=argparse.REMAINDER)
    add_client_commands(sub)
    add_nats_permissions_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "pipeline":
        # Lazy: only the pipeline needs PySpark; it loads its own config and prints its summary.
        from app.pipeline.job import main as pipeline_main

        top = ["--config", args.config] if args.config else []
        return pipeline_main([*top, *args.pipeline_args, *unknown])
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in CLIENT_COMMANDS:
        return run_client_command(args, "webhook-broker")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"webhook-broker: bad configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(config.log)
    warn_ignored_keys(config)
    warn_open_access(config)
    if args.command == "migrate":
        migrate(config)
        return 0
    if args.command == "bridge":
        return run_async(run_bridge(config))
    if args.command == "ledger":
        return run_async(run_ledger(config, args.settle))
    if args.command == COMMAND_NATS_PERMISSIONS:
        return run_async(run_nats_permissions(config, args))
    if args.command in ("sweeper", "dispatcher"):
        return run_async(run_worker(config, args.command))
    if args.command == "serve":
        migrate(config)
    return run_api(config, serve=args.command == "serve")


def run_async(main: Coroutine[Any, Any, int]) -> int:
    """Run a background process on uvloop when it is installed (uvicorn[standard] brings it)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    # A loop of its own, not a process-wide policy: `ledger` also runs inside the test process.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def freeze_heap() -> None:
    """Take what start-up built (modules, the app, pools: most of the heap, and it lives as long
    as the process) out of the cyclic garbage collector. Its full passes walked all of it again
    and again: under load the bridge paused for 55-66 ms every two seconds."""
    gc.collect()
    gc.freeze()


async def run_ledger(config: Config, settle: Sequence[str] | None) -> int:
    """Print the ledgers, or settle one (docs/operations/metrics.md: the delivery ledger)."""
    from app.domain.errors import NotFound
    from app.services.job_status import JobStatusQueries
    from app.store.db import Database

    db = Database.from_config(config.database)
    queries = JobStatusQueries(db)
    try:
        if settle is None:
            print("channel\tconsumer\tpublished\tremoved\theld\tunaccounted")
            for entry in await queries.ledger():
                print(
                    f"{entry.channel_id}\t{entry.consumer_id}\t{entry.published}"
                    f"\t{entry.removed}\t{entry.held}\t{entry.unaccounted}"
                )
            return 0
        channel_id, consumer_id = settle
        try:
            before = await queries.settle_ledger(channel_id, consumer_id)
        except NotFound as exc:
            print(f"webhook-broker: {exc}", file=sys.stderr)
            return EXIT_FAILED
        print(
            f"settled {channel_id}/{consumer_id}: {before.unaccounted} unaccounted before"
            f" (published {before.published}, removed {before.removed}, held {before.held});"
            " 0 from here"
        )
        return 0
    finally:
        await db.dispose()


def migrate(config: Config) -> None:
    from app.store.migrate import upgrade

    upgrade(config.database)
    log.info("database migrated to the newest schema")


def run_api(config: Config, *, serve: bool) -> int:
    """`api` (the HTTP API) or `serve` (with the sweeper and the push dispatcher), started and
    stopped by create_app's lifespan."""
    import uvicorn

    from app.api.app import create_app
    from app.roots.api import ApiRoot
    from app.roots.serve import ServeRoot

    root = (
        ServeRoot(config, run_sweeper=True, run_dispatcher=True, nats_advisories=True)
        if serve
        else ApiRoot(config, nats_advisories=True)
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            # Waiting long polls return now, so draining in-flight requests ends promptly;
            # /_ready fails from here on.
            root.begin_draining()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own version re-raises the signal once shut down, so a drained SIGTERM
            # would still end the process with status -15; ours returns and exits 0.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            stops = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    app = create_app(config, root, owned=True, on_started=freeze_heap)
    server = Server(uvicorn.Config(app, **server_options(config)))
    server.run()
    return 0 if server.started else 1


def server_options(config: Config) -> dict[str, Any]:
    """uvicorn.Config's keyword arguments for the API (also the bench's bare floor route's,
    bench/floor.py, so that both run on the same server stack)."""
    from app.api.limits import uvicorn_limits

    return {
        "host": config.http.host,
        "port": config.http.port,
        "log_config": None,
        "access_log": False,  # app/api/requests.py writes one line per request, with its id
        "timeout_graceful_shutdown": config.http.write_timeout,
        "lifespan": "on",
        # [http] max-concurrency and read-header-timeout (slowloris); a body's own read
        # bounds are the routes' (app/api/limits.py).
        **uvicorn_limits(config),
    }


def serve_metrics(runtime: Process) -> Callable[[], None]:
    """[metrics] listener: this worker's /metrics on its own port (nothing when unset)."""
    listener = runtime.config.metrics.listener
    if listener is None:
        return lambda: None
    log.info("metrics on http://%s:%d/metrics", *listener)
    return runtime.metrics.serve(*listener)


def stopping(stop: asyncio.Event, command: str, config: Config) -> None:
    """The first stop signal drains (within a bound it logs); a second exits at once."""
    if stop.is_set():
        log.warning("%s: second stop signal, exiting now", command)
        os._exit(1)
    # Deliveries in flight end within the HTTP timeout; the runtime gives its tasks 10 s more.
    bound = config.consumer_connection.connection_timeout_seconds + 10
    log.info("%s stopping: work in flight ends within %d s", command, bound)
    stop.set()


async def run_worker(config: Config, command: str) -> int:
    """A background process (sweeper or dispatcher) that runs until SIGTERM or SIGINT."""
    from app.roots.dispatcher import DispatcherRoot
    from app.roots.sweeper import SweeperRoot

    root = SweeperRoot(config) if command == "sweeper" else DispatcherRoot(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, stop, command, config)
    await root.start(seed=False)
    stop_metrics = serve_metrics(root)
    freeze_heap()
    log.info("%s running", command)
    await stop.wait()
    await root.stop()
    stop_metrics()
    return 0


async def run_bridge(config: Config) -> int:
    """The NATS bridge until SIGTERM or SIGINT; waiting pulls end, received acks are applied."""
    from app.roots.bridge import BridgeRoot

    root = BridgeRoot(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, stop, "bridge", config)
    await root.start(seed=False)
    stop_metrics = serve_metrics(root)
    freeze_heap()
    try:
        await root.serve(stop)
    finally:
        await root.stop()
        stop_metrics()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
