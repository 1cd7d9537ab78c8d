"""The single place that configures logging for every process."""

from __future__ import annotations

import logging
import sys

from app.config import LogConfig

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
    # Driver chatter at DEBUG would include statement parameters; keep it out of broker logs.
    for noisy in ("sqlalchemy", "aiosqlite", "psycopg", "httpcore", "httpx"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.getLevelName(config.level)))
