"""Schemathesis against the API's own OpenAPI document (app/api/openapi.py), served by uvicorn
on PostgreSQL: every operation, with valid and invalid generated requests, about half of them
naming the real channel, consumers, messages and jobs with their tokens
(tests/openapi_fuzz_hooks.py), then stateful sequences along the links it infers. No 5xx, no
answer slower than 10 s, and every status, content type, header and body as documented.

Reproducible: deterministic generation (which keeps no example database)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.app import create_app
from app.config import Config, load_config_text
from app.runtime import Runtime
from tests.helpers.live import served
from tests.helpers.pull import CHANNEL, publish, pull, put_consumer, setup_channel

ROOT = Path(__file__).resolve().parent.parent
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "stream_lines_conformance",  # tests/openapi_fuzz_hooks.py
)
# CI's size; OPENAPI_FUZZ_EXAMPLES=100 for a longer run (docs/operations/reliability.md).
EXAMPLES_PER_OPERATION = int(os.environ.get("OPENAPI_FUZZ_EXAMPLES", "10"))
MESSAGES = 30  # jobs for the generated pulls to claim
ERROR = {"$ref": "#/components/schemas/Error"}
FORM = "application/x-www-form-urlencoded"
GATEWAY = f"[gateway-auth]\nmode=hmac\nhmac-shared-secret={base64.b64encode(b'k' * 32).decode()}\n"


@pytest.fixture
def backend() -> str:
    return "postgresql"


@pytest.fixture
def extra_config() -> str:
    # A generated pull that names a real consumer with nothing due waits a second at most.
    return "[pull]\nmax-expires-seconds=1\n"


@pytest.fixture
async def live(config: Config, runtime: Runtime) -> AsyncIterator[str]:
    async with served(config, runtime) as base:
        yield base


async def set_up(base: str) -> None:
    """What the hooks name: consumers k1 (pull), kg (pinned_client) and push1 (no dispatcher
    runs here), messages m0-m29 (jobs 1-90) and s1 (scheduled), an acked, a dead and an
    in-flight job of k1, and a redrive (1) that stays RUNNING (no redrive runner runs here)."""
    async with httpx.AsyncClient(base_url=base) as client:
        (k1,) = await setup_channel(client, "k1")
        await put_consumer(client, "kg", priorityGroups="g1", priorityPolicy="pinned_client")
        form = {"token": "push1-token", "callbackUrl": "http://127.0.0.1:9/hook"}
        r = await client.put(f"/channel/{CHANNEL}/consumer/push1", data=form)
        assert r.status_code == 200, r.text
        for n in range(MESSAGES):
            await publish(client, f"payload {n}", message_id=f"m{n}")
        due = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        await publish(client, "later", message_id="s1", headers={"X-Broker-Scheduled-For": due})
        jobs = (await pull(client, k1, batch=3, no_wait=True)).json()["Jobs"]
        assert len(jobs) == 3
        for job, kind in zip(jobs, ("ack", "term"), strict=False):
            r = await client.post(f"{k1.job(job['ID'])}/ack", json={"type": kind}, headers=k1.auth)
            assert r.status_code == 202, r.text
        r = await client.post(f"{k1.base}/redrives", json={}, headers=k1.auth)
        assert r.status_code == 202 and r.json()["ID"] == "1", r.text


@pytest.mark.timeout(600)
async def test_every_operation_answers_as_its_openapi_document_says(
    live: str, tmp_path: Path
) -> None:
    await set_up(live)
    # No cache of past failures replayed from one run to the next (it would live in the
    # working directory's .schemathesis/, here tmp_path, as would anything else it writes).
    (tmp_path / "schemathesis.toml").write_text("[cache]\nenabled = false\n")
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        f"--config-file={tmp_path / 'schemathesis.toml'}",
        "run",
        f"{live}/openapi.json",
        f"--checks={','.join(CHECKS)}",
        "--max-response-time=10",
        "--request-timeout=10",
        f"--max-examples={EXAMPLES_PER_OPERATION}",
        "--generation-deterministic",
        "--workers=1",
        "--no-color",
        # GET /channel/{channel_id} and the like have one string parameter, in the path: nearly
        # every negative value for it is one no client can send there ("/", "", "..").
        "--suppress-health-check=filter_too_much",
        "--report=har",  # every request and response, to look into a failure
        f"--report-dir={tmp_path}",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.openapi_fuzz_hooks", "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=480)
    report = output.decode(errors="replace")
    print(report)
    print(f"schemathesis took {time.monotonic() - started:.1f} s")
    assert process.returncode == 0, report[-30_000:]
    operations = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", report)
    assert operations is not None, report[-5_000:]
    assert len(set(operations.groups())) == 1, operations.group(0)  # every operation, tested


def document(extra: str = "") -> dict[str, Any]:
    config = load_config_text(extra)
    return create_app(config).openapi()


def test_the_document_declares_answers_errors_and_bodies() -> None:
    plain = document()
    assert "422" not in json.dumps(plain)
    operations = [(path, op) for path, ops in plain["paths"].items() for op in ops.values()]
    # which operations there are is test_openapi_complete's: this checks what each declares
    assert operations
    for path, op in operations:
        statuses = op["responses"]
        assert any(s < "300" for s in statuses), (path, statuses)
        for status, answer in statuses.items():
            assert "X-Request-ID" in answer["headers"], (path, status)
            if status >= "400" and path not in ("/_status", "/_ready"):
                assert answer["content"] == {"application/json": {"schema": ERROR}}, (path, status)
    paths = plain["paths"]
    assert (
        FORM
        in paths["/channel/{channel_id}/consumer/{consumer_id}"]["put"]["requestBody"]["content"]
    )
    assert "*/*" in paths["/channel/{channel_id}/broadcast"]["post"]["requestBody"]["content"]
    pulled = paths["/channel/{channel_id}/consumer/{consumer_id}/pull"]["post"]["responses"]["200"]
    assert set(pulled["content"]) == {"application/json", "application/x-ndjson"}

    # With [http] admin-token set, changes may answer 401 and 403; with the HMAC gateway every
    # path it guards may, in plain text.
    guarded = document(f"[http]\nadmin-token=secret\n{GATEWAY}")["paths"]
    assert {"401", "403"} <= set(guarded["/producer/{producer_id}"]["put"]["responses"])
    assert "401" not in plain["paths"]["/producer/{producer_id}"]["put"]["responses"]
    refused = guarded["/channels"]["get"]["responses"]["401"]["content"]
    assert refused == {
        "text/plain": {"schema": {"type": "string"}},
        "application/json": {"schema": ERROR},
    }
    assert "401" not in plain["paths"]["/channels"]["get"]["responses"]  # open reads
    assert "401" not in guarded["/_status"]["get"]["responses"]  # exempt


async def test_no_route_and_no_such_method_answer_the_error_body(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/no/such/path")
    assert r.status_code == 404 and r.json() == {"error": 404, "detail": "Not Found"}
    r = await client.delete("/channels")
    assert r.status_code == 405 and r.json() == {"error": 405, "detail": "Method Not Allowed"}
    assert r.headers["Allow"] == "GET"
