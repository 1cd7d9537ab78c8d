"""The single place that configures logging for every process."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from app.config import Config, LogConfig
from app.domain.errors import Unavailable

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Fields a log call may attach (`extra=`) that the JSON form writes as keys of their own.
FIELDS = (
    "request_id",
    "method",
    "path",
    "status",
    "duration_ms",
    "channel_id",
    "consumer_id",
)


# Libraries whose INFO is chatter (SQLAlchemy's INFO carries statement parameters, tokens among
# them; Alembic announces its dialect and DDL mode on every start).
NOISY = ("sqlalchemy", "aiosqlite", "psycopg", "httpcore", "httpx", "asyncio", "alembic")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the request's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(config: LogConfig) -> None:
    handler: logging.Handler = (
        logging.FileHandler(config.filename, encoding="utf-8")
        if config.filename
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(JsonFormatter() if config.format == "json" else logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
    # Only their warnings reach broker logs.
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def warn_ignored_keys(config: Config) -> None:
    """Name every key of the Go original that was set but does nothing here yet."""
    if config.ignored_keys:
        logging.getLogger("app.config").warning(
            "config keys with no effect yet (the Go original's, not implemented here): %s",
            ", ".join(config.ignored_keys),
        )


def warn_open_access(config: Config) -> None:
    """Every opt-out of the secure defaults, named at every start."""
    http = config.http
    log = logging.getLogger("app.config")
    if not http.admin_token and not http.loopback:
        log.warning(
            "[http] allow-anonymous-admin=true: the listener %s:%d is not loopback and has no "
            "admin-token: anyone who reaches it can change channels, producers and consumers "
            "and read every message",
            http.host,
            http.port,
        )
    if http.anonymous_reads and (http.admin_token or http.reader_token):
        log.warning(
            "[http] anonymous-reads=true: channels, consumers, producers, messages and job "
            "counts can be read without a credential"
        )


def log_failure(logger: logging.Logger, message: str, *args: object) -> None:
    """In an `except` block of a worker loop: an outage of the database is one warning line
    (an outage repeats it every round: tracebacks would bury everything else); anything else
    is logged with its traceback."""
    exc = sys.exc_info()[1]
    if isinstance(exc, Unavailable):
        logger.warning(message + ": %s", *args, exc)
    else:
        logger.exception(message, *args)
