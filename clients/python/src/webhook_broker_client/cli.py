"""The CLI's client commands, for operators and debugging: `publish`, `pull` and `consume`,
over HTTP through this package. The broker's address and the tokens come from flags or from the
environment (WEBHOOK_BROKER_URL, WEBHOOK_BROKER_CHANNEL_TOKEN, WEBHOOK_BROKER_PRODUCER_ID,
WEBHOOK_BROKER_PRODUCER_TOKEN, WEBHOOK_BROKER_CONSUMER_TOKEN)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook_broker_client import Job

CLIENT_COMMANDS = ("publish", "pull", "consume")
DEFAULT_URL = "http://localhost:8080"
EXIT_FAILED = 1


class Problem(Exception):
    """What the command could not do, said on stderr."""


def _env_flag(parser: argparse.ArgumentParser, flag: str, env: str, text: str) -> None:
    parser.add_argument(flag, default=os.environ.get(env), help=f"{text} (default: ${env})")


def add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("WEBHOOK_BROKER_URL", DEFAULT_URL),
        help=f"the broker's address (default: $WEBHOOK_BROKER_URL or {DEFAULT_URL})",
    )
    _env_flag(common, "--channel-token", "WEBHOOK_BROKER_CHANNEL_TOKEN", "the channel's token")
    common.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    publish = sub.add_parser("publish", parents=[common], help="publish one message")
    publish.add_argument("channel")
    body = publish.add_mutually_exclusive_group(required=True)
    body.add_argument("--data", help="the payload")
    body.add_argument("--file", type=Path, help="read the payload from a file ('-': stdin)")
    publish.add_argument("--priority", type=int)
    publish.add_argument("--message-id", help="idempotency key: a repeat changes nothing")
    publish.add_argument("--content-type", default="application/octet-stream")
    _env_flag(publish, "--producer-id", "WEBHOOK_BROKER_PRODUCER_ID", "the producer")
    _env_flag(publish, "--producer-token", "WEBHOOK_BROKER_PRODUCER_TOKEN", "its token")

    consumer = argparse.ArgumentParser(add_help=False)
    consumer.add_argument("channel")
    consumer.add_argument("consumer")
    _env_flag(consumer, "--consumer-token", "WEBHOOK_BROKER_CONSUMER_TOKEN", "its token")

    pull = sub.add_parser("pull", parents=[common, consumer], help="claim jobs and print them")
    pull.add_argument("--batch", type=int, default=1, help="most jobs to claim (default 1)")
    pull.add_argument("--expires", type=float, default=5.0, help="seconds to wait (default 5)")
    pull.add_argument("--ack", action="store_true", help="acknowledge each job once printed")
    pull.add_argument("--json", action="store_true", help="one JSON object per job")

    consume = sub.add_parser(
        "consume",
        parents=[common, consumer],
        help="run a command per job: ack on exit 0, nak otherwise; until SIGINT or SIGTERM",
    )
    consume.add_argument(
        "--exec",
        dest="command_line",
        required=True,
        help="shell command; the payload on its stdin, the job in WEBHOOK_BROKER_JOB_* variables",
    )
    consume.add_argument("--concurrency", type=int, default=1, help="jobs at once (default 1)")
    consume.add_argument("--max-messages", type=int, default=10, help="jobs buffered (default 10)")


def run_client_command(args: argparse.Namespace, prog: str = "webhook-broker-client") -> int:
    """Run the parsed command; `prog` names the program in what it says on stderr."""
    args.prog = prog
    try:
        return asyncio.run(COMMANDS[args.command](args))
    except Problem as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _need(value: str | None, flag: str) -> str:
    if not value:
        raise Problem(f"{flag} is required (or its environment variable)")
    return value


async def publish(args: argparse.Namespace) -> int:
    from webhook_broker_client import Broker, BrokerError

    if args.file is not None:
        payload = sys.stdin.buffer.read() if str(args.file) == "-" else _read(args.file)
    else:
        payload = args.data.encode()
    async with Broker(
        args.url,
        producer_id=_need(args.producer_id, "--producer-id"),
        producer_token=_need(args.producer_token, "--producer-token"),
        channel_tokens={args.channel: _need(args.channel_token, "--channel-token")},
    ) as broker:
        try:
            published = await broker.publish(
                args.channel,
                payload,
                priority=args.priority,
                message_id=args.message_id,
                content_type=args.content_type,
            )
        except BrokerError as exc:
            raise Problem(str(exc)) from None
    print(published.location if published.created else f"duplicate: {published.location}")
    return 0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise Problem(f"cannot read {path}: {exc.strerror}") from None


def _consumer(args: argparse.Namespace) -> Any:
    from webhook_broker_client import Broker

    broker = Broker(args.url)
    return broker, broker.consumer(
        args.channel,
        args.consumer,
        channel_token=_need(args.channel_token, "--channel-token"),
        consumer_token=_need(args.consumer_token, "--consumer-token"),
    )


def describe(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "attempt": job.attempt,
        "priority": job.priority,
        "message_id": job.message_id,
        "lease_expires_at": job.lease_expires_at.isoformat(),
        "headers": job.headers,
        "payload": job.payload.decode("utf-8", errors="replace"),
    }


async def pull(args: argparse.Namespace) -> int:
    from webhook_broker_client import BrokerError

    broker, consumer = _consumer(args)
    async with broker:
        try:
            jobs = await consumer.fetch(args.batch, expires=args.expires)
            for job in jobs:
                if args.json:
                    print(json.dumps(describe(job)), flush=True)
                else:
                    text = job.payload.decode("utf-8", errors="replace")
                    print(f"{job.id}\tattempt {job.attempt}\t{text}", flush=True)
                if args.ack:
                    await job.ack()
        except BrokerError as exc:
            raise Problem(str(exc)) from None
    return 0


async def consume(args: argparse.Namespace) -> int:
    from webhook_broker_client import BrokerError

    broker, consumer = _consumer(args)

    async def handle(job: Job) -> None:
        env = {
            **os.environ,
            "WEBHOOK_BROKER_JOB_ID": job.id,
            "WEBHOOK_BROKER_JOB_ATTEMPT": str(job.attempt),
            "WEBHOOK_BROKER_MESSAGE_ID": job.message_id,
        }
        process = await asyncio.create_subprocess_shell(
            args.command_line, stdin=asyncio.subprocess.PIPE, env=env
        )
        await process.communicate(job.payload)
        if process.returncode == 0:
            await job.ack()
        else:
            print(f"job {job.id}: exit status {process.returncode}; nak", file=sys.stderr)
            await job.nak()

    def report(error: Exception) -> None:
        print(f"{args.prog} consume: {error}", file=sys.stderr)

    async with broker:
        context = consumer.consume(
            handle,
            max_messages=max(args.max_messages, args.concurrency),
            concurrency=args.concurrency,
            auto_ack=False,
            error_callback=report,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Finish the jobs being run, hand back the ones never started, then exit.
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(context.drain()))
        try:
            await context.wait()
        except BrokerError as exc:
            raise Problem(str(exc)) from None
    return 0


COMMANDS = {"publish": publish, "pull": pull, "consume": consume}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="webhook-broker-client",
        description="Publish messages to a webhook-broker, and pull or consume its jobs, over"
        " HTTP. The address and tokens come from flags or WEBHOOK_BROKER_* variables.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    add_client_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`webhook-broker-client publish|pull|consume ...`: the same commands as the server's
    `webhook-broker publish|pull|consume`, for a machine that has only the client installed."""
    args = build_parser().parse_args(argv)
    return run_client_command(args)


if __name__ == "__main__":
    sys.exit(main())
