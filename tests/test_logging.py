"""Structured logs: with `log-format=json` each access line is one JSON object with the
request's fields, and never a token, a signature or a payload."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from app.config import ConfigError, load_config_text
from app.domain.errors import Unavailable
from app.logging import JsonFormatter, log_failure
from tests.helpers.pull import publish, pull_jobs, setup_channel


async def test_access_lines_as_json(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook_broker.access")
    (k1,) = await setup_channel(client, "k1")
    await publish(client, "secret payload")
    await pull_jobs(client, k1, batch=1, no_wait=True)
    formatter = JsonFormatter()
    lines = [formatter.format(r) for r in caplog.records if r.name == "webhook_broker.access"]
    entries = [json.loads(line) for line in lines]
    pulled = next(e for e in entries if e["path"].endswith("/pull"))
    assert pulled["method"] == "POST" and pulled["status"] == 200
    assert pulled["channel_id"] == "c1" and pulled["consumer_id"] == "k1"
    assert len(pulled["request_id"]) >= 16 and pulled["duration_ms"] >= 0
    assert pulled["level"] == "info" and pulled["logger"] == "webhook_broker.access"
    everything = "\n".join(lines)
    for secret in ("secret payload", "k1-token", "channel-token", "producer-token"):
        assert secret not in everything


def test_log_format_is_text_or_json() -> None:
    assert load_config_text("[log]\nlog-format=json\n").log.format == "json"
    assert load_config_text("").log.format == "text"
    with pytest.raises(ConfigError, match=r"\[log\] log-format"):
        load_config_text("[log]\nlog-format=xml\n")


def test_a_worker_loop_logs_an_outage_in_one_line_and_a_bug_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("webhook_broker.test.worker")
    with caplog.at_level(logging.INFO, logger=logger.name):
        try:
            raise Unavailable("the database is unavailable; retry")
        except Unavailable:
            log_failure(logger, "sweep failed; trying again next round")
        try:
            raise KeyError("a bug")
        except KeyError:
            log_failure(logger, "claim for consumer %s failed", "k1")
    outage, bug = caplog.records
    assert (outage.levelno, outage.exc_info) == (logging.WARNING, None)
    assert outage.getMessage() == (
        "sweep failed; trying again next round: the database is unavailable; retry"
    )
    assert bug.levelno == logging.ERROR and bug.exc_info is not None
    assert bug.getMessage() == "claim for consumer k1 failed"
