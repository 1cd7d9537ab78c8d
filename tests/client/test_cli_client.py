"""`webhook-broker publish | pull | consume` as real processes against a real broker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers.processes import Setup, job_state
from tests.helpers.waiting import eventually


def cli_env(setup: Setup) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOK_BROKER")}
    env.update(
        WEBHOOK_BROKER_URL=setup.process.url,
        WEBHOOK_BROKER_CHANNEL_TOKEN="orders-token",
        WEBHOOK_BROKER_PRODUCER_ID="shop",
        WEBHOOK_BROKER_PRODUCER_TOKEN=str(setup.broker.producer_token),
        WEBHOOK_BROKER_CONSUMER_TOKEN=setup.consumer_token,
    )
    return env


async def cli(setup: Setup, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", *args],
            input=stdin.decode(),
            env=cli_env(setup),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    return await asyncio.to_thread(run)


async def test_publish_and_pull(setup: Setup, tmp_path: Path) -> None:
    done = await cli(setup, "publish", setup.channel, "--data", "hello", "--message-id", "m-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"/channel/{setup.channel}/message/m-1"
    again = await cli(setup, "publish", setup.channel, "--data", "hello", "--message-id", "m-1")
    assert again.returncode == 0 and again.stdout.startswith("duplicate:")
    payload = tmp_path / "payload.json"
    payload.write_text('{"order": 2}')
    done = await cli(
        setup, "publish", setup.channel, "--file", str(payload), "--priority", "5",
        "--content-type", "application/json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = await cli(setup, "publish", setup.channel, "--file", "-", stdin=b"from stdin")
    assert done.returncode == 0, done.stderr
    pulled = await cli(setup, "pull", setup.channel, "billing", "--batch", "2", "--json", "--ack")
    assert pulled.returncode == 0, pulled.stderr
    jobs = [json.loads(line) for line in pulled.stdout.splitlines()]
    assert [j["payload"] for j in jobs] == ['{"order": 2}', "hello"]
    for job in jobs:
        assert (await job_state(setup, job["id"]))["Status"] == "DELIVERED"
    plain = await cli(setup, "pull", setup.channel, "billing", "--expires", "1")
    assert plain.returncode == 0 and plain.stdout.split("\t")[2].strip() == "from stdin"
    info = await setup.consumer.info()
    assert info.ack_pending == 1  # printed, not acked


async def test_client_commands_say_what_is_wrong(setup: Setup) -> None:
    bad = await cli(setup, "publish", setup.channel, "--data", "x", "--channel-token", "nope")
    assert bad.returncode == 1 and "403" in bad.stderr
    missing = await cli(setup, "pull", "nowhere", "billing")
    assert missing.returncode == 1 and "404" in missing.stderr
    unreadable = await cli(setup, "publish", setup.channel, "--file", "/nonexistent")
    assert unreadable.returncode == 1 and "cannot read" in unreadable.stderr
    usage = await cli(setup, "publish", setup.channel)
    assert usage.returncode == 2 and "--data" in usage.stderr


async def test_consume_runs_a_command_per_job(setup: Setup, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    script = f'if [ "$(cat)" = bad ]; then exit 3; fi; echo "$WEBHOOK_BROKER_JOB_ID" >> {out}'
    for text in ("one", "bad", "two"):
        await setup.broker.publish(setup.channel, text)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app", "consume", setup.channel, "billing", "--exec", script,
        env=cli_env(setup),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await eventually(
            lambda: out.exists() and len(out.read_text().split()) >= 2,
            30,
            0.1,
            what="the command run for each job",
        )
        await asyncio.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        _, raw = await asyncio.wait_for(process.communicate(), 30)
        stderr = raw.decode()
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "exit status 3; nak" in stderr
    done = out.read_text().split()
    states = {job_id: (await job_state(setup, job_id))["Status"] for job_id in done}
    assert list(states.values()) == ["DELIVERED", "DELIVERED"]
    info = await setup.consumer.info()
    assert info.ack_pending == 0  # the bad one was naked, and nothing stays leased
