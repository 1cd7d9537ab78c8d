"""[http] read-header-timeout on a busy keep-alive connection (app/api/limits.py): the deadline
is one timer per connection that moves itself when answers came since it was set (issue 40),
so requests spaced under the timeout keep the connection past any number of first deadlines,
and the connection is still closed that long after its last answer."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.bounded import start_process
from tests.helpers.processes import BrokerProcess

TIMEOUT = 1.0


@pytest.fixture(scope="module")
def broker(
    sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    http = f"read-header-timeout={TIMEOUT:g}\n"
    process = start_process(sqlite_template, tmp_path_factory.mktemp("deadline"), http)
    try:
        yield process
    finally:
        process.stop()


def test_requests_under_the_timeout_keep_the_connection_and_idleness_ends_it(
    broker: BrokerProcess,
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=5)
    conn.request("GET", "/_status")
    first = conn.getresponse()
    assert first.status == 200
    first.read()
    sock = conn.sock
    assert sock is not None
    started = time.monotonic()
    # Three timeouts' worth of requests, each within half a timeout of the last answer (the
    # pacing is the client's: what is tested is the time between requests).
    while time.monotonic() - started < 3 * TIMEOUT:
        time.sleep(TIMEOUT / 2)
        conn.request("GET", "/_status")
        response = conn.getresponse()
        assert response.status == 200  # not closed: the deadline moved with each answer
        response.read()
        assert conn.sock is sock  # the same connection throughout
    answered = time.monotonic()
    sock.settimeout(4 * TIMEOUT)
    assert sock.recv(4096) == b""  # closed by the server, no answer
    idle = time.monotonic() - answered
    assert 0.8 * TIMEOUT <= idle <= 3 * TIMEOUT, idle
    conn.close()
