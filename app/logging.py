"""The single place that configures logging for every process."""

from __future__ import annotations

import logging
import sys

from app.config import Config, LogConfig

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(config: LogConfig) -> None:
    handler: logging.Handler = (
        logging.FileHandler(config.filename, encoding="utf-8")
        if config.filename
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
    # SQLAlchemy logs statements with their parameters (tokens among them) at INFO, and the
    # drivers and HTTP client are chatty: only their warnings reach broker logs.
    for noisy in ("sqlalchemy", "aiosqlite", "psycopg", "httpcore", "httpx", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def warn_ignored_keys(config: Config) -> None:
    """Name every key of the Go original that was set but does nothing here yet."""
    if config.ignored_keys:
        logging.getLogger("app.config").warning(
            "config keys with no effect yet (the Go original's, not implemented here): %s",
            ", ".join(config.ignored_keys),
        )
