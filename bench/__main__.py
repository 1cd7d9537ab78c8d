"""`python -m bench` (or bench/run): the benchmarks of issue 7, in one command.

Starts a throwaway PostgreSQL, nats-server (JetStream), a push receiver and the broker's
processes (`webhook-broker api` x N + a sweeper), runs every scenario for a fixed window after a
warm-up, prints the tables, writes bench/results/<date>.json and tears everything down.
Default run: under 10 minutes. `--quick`: about two minutes, for smoke runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench import retention
from bench.env import REPO, Env, Settings
from bench.report import tables, write_json
from bench.scenarios import Runner

SCENARIOS = (
    "ceiling",
    "pull-batch",
    "pull-each",
    "publish",
    "floor",
    "goproto",
    "push",
    "wakeup",
    "consume",
    "idle",
    "idle-scheduled",
    "jetstream",
    "bridge",
    "bridge-hybrid",
    "redelivery",
    "overflow",
    "pull-console",
    "pgqueuer",
    "backlog",
    "soak",
    "retention",
    "retention-delete",
)


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run, about two minutes")
    p.add_argument("--duration", type=float, help="measured seconds per scenario (default 8)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per scenario (default 2)")
    p.add_argument("--pgbench-duration", type=float, help="measured seconds per pgbench run (4)")
    p.add_argument("--rounds", type=int, help="ceiling/ours pairs per comparison (default 3)")
    p.add_argument("--clients", help="pgbench client counts, comma separated (default 1,4,16)")
    p.add_argument("--pollers", type=int, help="concurrent HTTP pullers (default 4)")
    p.add_argument("--publishers", type=int, help="concurrent HTTP publishers (default 4)")
    p.add_argument("--batch", type=int, help="pull / fetch / claim batch (default 100)")
    p.add_argument("--api-procs", type=int, help="`webhook-broker api` processes (default 2)")
    p.add_argument("--small-backlog", type=int, help="queued jobs, small case (default 10000)")
    p.add_argument(
        "--large-backlog",
        type=int,
        help="queued jobs, large case (default 1000000, loads in about a minute; the issue's "
        "case is 10000000)",
    )
    p.add_argument("--wake-samples", type=int, help="long-poll wake-up samples (default 100)")
    p.add_argument("--idle-pollers", type=int, help="idle long-pollers (default 100)")
    p.add_argument(
        "--push-dispatchers",
        type=int,
        help="dispatcher processes in the push scenarios (default: one per core)",
    )
    p.add_argument(
        "--soak",
        type=float,
        default=0.0,
        help="also run a soak of this many seconds (the issue's is 600)",
    )
    p.add_argument(
        "--retention-jobs",
        type=int,
        help="jobs of the retention scenarios (default 20000000; they run only when named in "
        "--only or sized here: hours at the issue's size)",
    )
    p.add_argument("--retention-cycle", type=int, help="jobs per retention cycle (default 1000000)")
    p.add_argument(
        "--retention-control",
        type=float,
        help="a control run of the retention scenarios: no archive, a wait of this many seconds "
        "in its place, to show what the windows differ by without one",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy one API process in an extra run of each paired scenario",
    )
    p.add_argument("--durable", action="store_true", help="fsync and synchronous_commit on")
    p.add_argument("--only", help="comma-separated scenarios: " + ",".join(SCENARIOS))
    p.add_argument("--skip", help="comma-separated scenarios to leave out")
    p.add_argument("--list", action="store_true", help="print the scenarios' names and exit")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument(
        "--results",
        default=str(REPO / "bench" / "results"),
        help="directory of the JSON results (default bench/results)",
    )
    a = p.parse_args(argv)
    if a.list:
        print("\n".join(SCENARIOS))
        raise SystemExit(0)
    s = Settings()
    if a.quick:
        s = Settings(
            warmup=0.5,
            duration=2.5,
            pgbench_warmup=0.5,
            pgbench_duration=2.0,
            rounds=1,
            clients=(4,),
            large_backlog=100_000,
            latency_pulls=10,
            wake_samples=30,
            quick=True,
        )
    for name in (
        "duration",
        "warmup",
        "pgbench_duration",
        "rounds",
        "pollers",
        "publishers",
        "batch",
        "api_procs",
        "small_backlog",
        "large_backlog",
        "wake_samples",
        "idle_pollers",
        "push_dispatchers",
        "retention_jobs",
        "retention_cycle",
        "retention_control",
    ):
        value = getattr(a, name)
        if value is not None:
            setattr(s, name, value)
    if a.clients:
        s.clients = tuple(int(c) for c in a.clients.split(","))
    for name, given in (("only", a.only), ("skip", a.skip)):
        if given:
            chosen = tuple(x.strip() for x in given.split(",") if x.strip())
            unknown = set(chosen) - set(SCENARIOS)
            if unknown:
                p.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
            setattr(s, name, chosen)
    s.soak, s.profile, s.durable, s.keep = a.soak, a.profile, a.durable, a.keep
    s.results_dir = a.results
    if s.batch > 256:
        p.error("--batch is capped by [pull] max-batch (256)")
    return s


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
    }
    for module in ("uvloop", "httptools", "psutil", "pgqueuer", "nats"):
        try:
            __import__(module)
            facts[module] = True
        except ImportError:
            facts[module] = False
    try:
        facts["git_head"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
        facts["worktree_dirty"] = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "app", "clients"],
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout.strip()
        )
    except OSError:
        pass
    return facts


async def run(settings: Settings) -> int:
    started = time.time()
    env = Env(settings)
    runner = Runner(env)
    failures: list[str] = []
    meta: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    main_task = asyncio.current_task()
    if main_task is not None:
        # SIGTERM tears down like Ctrl-C: the children run in sessions of their own.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        runner.say(
            f"starting PostgreSQL, nats-server, receiver and {settings.api_procs} API "
            f"processes (work dir {env.workdir})"
        )
        await env.start()
        meta["postgres"] = str(env.cluster.bindir)
        steps = [
            ("ceiling", runner.ceiling_matrix),
            ("pairs", runner.paired_rounds),
            ("goproto", runner.goproto),
            ("push", runner.push),
            ("wakeup", runner.wakeup),
            ("consume", runner.consume),
            ("idle", runner.idle),
            ("nats", runner.nats_pairs),
            ("redelivery", runner.redelivery),
            ("overflow", runner.overflow),
            ("pull-console", runner.console),
            ("pgqueuer", runner.pgqueuer),
            ("backlog", runner.backlog_latency),
            ("retention", runner.retention),
        ]
        for name, step in steps:
            if name == "pairs":
                # The floor runs beside ours in the paired rounds.
                if not any(settings.wants(x) for x in ("pull-batch", "pull-each", "publish")):
                    continue
            elif name == "idle":
                if not any(settings.wants(x) for x in ("idle", "idle-scheduled")):
                    continue
            elif name == "nats":
                if not any(settings.wants(x) for x in ("jetstream", "bridge", "bridge-hybrid")):
                    continue
            elif name == "retention":
                if not retention.asked(settings):
                    continue
            elif not settings.wants(name):
                continue
            runner.say(f"scenario: {name}")
            try:
                await step()
            except Exception as exc:  # one failing scenario must not lose the others
                failures.append(f"{name}: {exc}")
                runner.say(f"  FAILED: {name}: {exc}")
                traceback.print_exc()
        if settings.wants("backlog"):
            try:
                await runner.explain_acks()
            except Exception as exc:
                failures.append(f"explain acks: {exc}")
        if settings.soak > 0 and settings.wants("soak"):
            runner.say("scenario: soak")
            try:
                await runner.soak()
            except Exception as exc:
                failures.append(f"soak: {exc}")
    finally:
        runner.say("tearing down")
        await env.stop()
    meta.update(
        {
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elapsed_s": round(time.time() - started, 1),
            "settings": {k: v for k, v in vars(settings).items()},
            "machine": machine_facts(),
            "failures": failures,
            "command": " ".join(["python -m bench", *sys.argv[1:]]),
        }
    )
    text = tables(runner)
    print()
    print(text)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    out = Path(settings.results_dir or REPO / "bench" / "results") / f"{stamp}.json"
    meta["tables_markdown"] = text
    write_json(out, runner, meta)
    print(f"\nresults: {out} ({meta['elapsed_s']:.0f}s)")
    if failures:
        print("failures:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


def main() -> None:
    settings = parse_args()
    raise SystemExit(asyncio.run(run(settings)))


if __name__ == "__main__":
    main()
