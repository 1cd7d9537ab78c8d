"""The scenarios: the pgbench ceiling, our HTTP paths, and the peers, each measured the same way.

Each measured run: fill the backlog it needs, VACUUM (so every run starts without the previous
run's dead tuples), warm up, then a fixed window in which jobs are counted from the database
and CPU from /proc (psutil).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from bench import db, plans, profile, redelivery, retention
from bench.broker import (
    PRODUCER,
    PUB_CONSUMERS,
    PUSH_CHANNEL,
    PUSH_CONSUMER,
    bridge_available,
    token,
    wait_http,
)
from bench.env import DBNAME, REPO, Env, Measured, wait_port
from bench.http1 import Connection
from bench.pgbench import JOBS_COUNTED_BY, jobs_per_script, run_pgbench, script_defines
from bench.procs import CpuMeter, Service
from devtools.console_pages import STATEMENTS_SQL, ConsolePages, console_cost
from devtools.pg import free_port

# First guesses of jobs/s, used only to size backlogs before a scenario has run once; every
# measurement replaces its guess. A backlog that runs dry is reported, never hidden.
GUESS = {
    "claim": 40_000.0,
    "batch_ack": 25_000.0,
    "each_ack": 11_000.0,
    "pull-batch": 20_000.0,
    "pull-each": 1_500.0,
    "goproto": 1_000.0,
    "push": 15_000.0,
    "jetstream": 50_000.0,
    "bridge": 10_000.0,
    "bridge-hybrid": 10_000.0,
    "pgqueuer": 12_000.0,
    "publish": 5_000.0,
    "consume": 10_000.0,
    "consume-raw": 15_000.0,
}
# The note on a run whose backlog ran dry: its rate is a lower bound.
RAN_OUT = "backlog ran out during the run: a lower bound"
PUB_CHANNEL = "pub"  # the channel of PUB_CONSUMERS, published to by PRODUCER
PGBENCH_CONSUMER = {"claim": "pgb-claim", "batch_ack": "pgb-batch", "each_ack": "pgb-each"}
# The client's consume() in the consume scenario: its defaults, but for the handlers.
CONSUME_MAX_MESSAGES = 1000
CONSUME_CONCURRENCY = 500
# The consumer each ack style of the HTTP pull scenarios drains.
PULL_CONSUMER = {"batch": "pull-batch", "each": "pull-each"}
PAIRS = {
    # our HTTP scenario -> the pgbench script that is its ceiling
    "pull-batch": "batch_ack",
    "pull-each": "each_ack",
    "publish": "publish",
}
STATUS_ACTIVE_HEAD = 12
NOTIFY = "webhook_broker_jobs"  # app/store/db.py NOTIFY_CHANNEL: what a publish wakes
PUSH_WINDOW = 200  # deliveries in flight: the dispatcher's max-workers, and each bare loop's
POST_CLIENTS = ("httpx", "aiohttp", "httpx-aiohttp", "pyreqwest")
IDLE_SCHEDULED = 1000  # scheduled messages in the idle-scheduled scenario
CONSOLE_PAGES = 20  # open console pages in the pull-console scenario (issue 38)


# The load generator's modes whose requests it counts (latencies of requests started in the
# window, by kind): the API CPU per request column (issue 40).
HTTP_MODES = ("pull", "publish", "goproto")
HTTP_REQUEST_KINDS = ("pull", "ack", "publish", "list", "transition")
FLOOR_NOTE = ", bare floor route"


def http_requests(latency_ms: dict[str, Any]) -> int:
    """HTTP requests started in the measured window, from the load generator's latencies."""
    return sum(int(latency_ms.get(kind, {}).get("n", 0)) for kind in HTTP_REQUEST_KINDS)


def redelivery_name(who: str) -> str:
    return f"Redelivery past a {redelivery.ACK_WAIT:.0f} s ack wait: {who}"


class Runner:
    def __init__(self, env: Env) -> None:
        self.env = env
        self.s = env.settings
        self.results: list[Measured] = []
        self.rates: dict[str, float] = dict(GUESS)
        self.best_clients: dict[str, int] = {}
        self.pairs: dict[str, list[dict[str, float]]] = {}
        # Our run of each paired round, by scenario: what the targets read ours from (other
        # sections run scenarios of the same names, some of them on purpose slower).
        self.paired_runs: dict[str, list[Measured]] = {}
        self.plans: dict[str, list[str]] = {}
        self.profiles: dict[str, Any] = {}
        self.log: list[str] = []
        self.floor_services: list[tuple[int, Service]] = []

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        self.log.append(line)
        print(line, flush=True)

    def keep(self, measured: Measured) -> Measured:
        self.results.append(measured)
        rate = f"{measured.rate:,.0f} jobs/s" if measured.status == "ok" else measured.status
        self.say(f"  {measured.name}: {rate}")
        return measured

    def need(self, key: str, seconds: float, minimum: int = 0, margin: float = 1.4) -> int:
        return max(minimum, int(self.rates.get(key, 1000.0) * seconds * margin))

    async def bigger_if_dry(
        self, once: Callable[[], Awaitable[Measured]], rate_key: str, growth: float
    ) -> Measured:
        """Run `once`; if its backlog ran dry, size the next one from the rate it reached and
        run it again, once (as pgbench and JetStream runs are sized)."""
        m = await once()
        if RAN_OUT in m.notes:
            self.say(f"  {m.name}: backlog ran out at {m.rate:,.0f}/s; again, bigger")
            self.rates[rate_key] = m.rate * growth
            m = await once()
        return self.keep(m)

    async def exhausted(self, m: Measured, consumer: str) -> None:
        left_over(m, await db.queued(self.env.conn, self.env.pks[consumer]))

    # -- the ceiling --------------------------------------------------------------------------

    async def pgbench(self, script: str, clients: int, name: str | None = None) -> Measured:
        """One pgbench run; run again, once, with a bigger backlog if it ran dry."""
        return await self.bigger_if_dry(
            lambda: self._pgbench_once(script, clients, name), f"{script}/{clients}", 2.0
        )

    async def _pgbench_once(self, script: str, clients: int, name: str | None) -> Measured:
        s, env = self.s, self.env
        warm, dur = s.pgbench_warmup, s.pgbench_duration
        consumer = PGBENCH_CONSUMER.get(script)
        key = f"{script}/{clients}"
        if consumer:
            guess = self.rates.get(key, self.rates[script])
            # Enough for the window; pgbench's last half second may run dry harmlessly.
            need = int(guess * (warm + dur + 0.3) * 1.3) + s.batch * clients * 2
            await env.backlog(consumer, need)
        await db.vacuum(env.conn, "job")
        pks = [env.pks[consumer]] if consumer else [env.pks[c] for c in PUB_CONSUMERS]
        defines = script_defines(
            consumer_pk=pks[0],
            # Claim-only runs leave their jobs in flight: a lease longer than the benchmark
            # keeps the sweeper from requeueing them in the middle of later scenarios.
            ack_wait=3600 if script == "claim" else 32,
            channel=PUB_CHANNEL,
            # The statements compare tokens as stored: keyed hashes (app/domain/tokens.py).
            channel_token=await db.stored_token(env.conn, token(PUB_CHANNEL)),
            producer=PRODUCER,
            producer_token=await db.stored_token(env.conn, token(PRODUCER)),
            payload=db.payload(),
        )
        meter = env.meter()
        launched = await db.clock(env.conn)
        task = asyncio.create_task(
            run_pgbench(
                bindir=env.cluster.bindir,
                port=env.cluster.port,
                dbname=DBNAME,
                workdir=env.workdir,
                script=script,
                batch=s.batch,
                clients=clients,
                seconds=math.ceil(warm + dur + 0.5),
                defines=defines,
                window=(warm, warm + dur),
            )
        )
        await asyncio.sleep(warm)
        meter.start()
        await db.statements_reset(env.conn)
        await asyncio.sleep(dur)
        meter.stop()
        left = await db.queued(env.conn, env.pks[consumer]) if consumer else None
        statements = await db.statements(env.conn, DBNAME)
        run = await task
        window = db.DbWindow(
            launched + timedelta(seconds=warm), launched + timedelta(seconds=warm + dur)
        )
        jobs = await db.count_jobs(env.conn, JOBS_COUNTED_BY[script], pks, window)
        m = Measured(
            name or f"pgbench {self.label(script)}, {clients} client{'s' if clients > 1 else ''}",
            "ceiling",
            jobs=jobs,
            seconds=window.seconds,
            latency_ms={"script": run.latency_ms},
            cpu=meter.percent(),
            extra={
                "script": script,
                "clients": clients,
                "pgbench_tps": run.tps,
                "pgbench_jobs_per_s": round(
                    run.tps * jobs_per_script(script, s.batch, len(pks)), 1
                ),
                "statements": statements[:STATUS_ACTIVE_HEAD],
            },
        )
        if run.failed:
            m.status = "failed"
            m.notes.append(run.output[-600:])
        if left is not None:
            left_over(m, left, "queued_left_at_window_end")
        if m.rate > 0:
            self.rates[key] = m.rate
            self.rates[script] = max(self.rates[script], m.rate)
        return m

    def label(self, script: str) -> str:
        return {
            "claim": f"claim({self.s.batch})",
            "batch_ack": f"claim({self.s.batch}) + batch ack",
            "each_ack": f"claim({self.s.batch}) + per-job ack",
            "publish": f"publish, fan-out {len(PUB_CONSUMERS)}",
        }[script]

    async def ceiling_matrix(self) -> None:
        self.say("pgbench ceiling: our statements at " + ", ".join(map(str, self.s.clients)))
        for script in ("claim", "batch_ack", "each_ack", "publish"):
            best: tuple[float, int] = (-1.0, self.s.clients[0])
            for clients in sorted(self.s.clients):
                # A run's rate sizes the next (larger) run's backlog.
                if clients > 1 and f"{script}/{clients}" not in self.rates:
                    smaller = [c for c in self.s.clients if c < clients]
                    if smaller:
                        previous = self.rates.get(f"{script}/{max(smaller)}", 0.0)
                        self.rates[f"{script}/{clients}"] = max(previous * 2.5, self.rates[script])
                m = await self.pgbench(script, clients)
                if m.status == "ok" and m.rate > best[0]:
                    best = (m.rate, clients)
            self.best_clients[script] = best[1]

    # -- our HTTP scenarios -------------------------------------------------------------------

    async def http_pull(self, ack: str, round_no: int | None = None) -> Measured:
        """Pull and ack over HTTP; run again, once, with a bigger backlog if it ran dry."""
        return await self.bigger_if_dry(
            lambda: self._http_pull_once(ack, round_no), PULL_CONSUMER[ack], 2.0
        )

    async def _http_pull_once(
        self,
        ack: str,
        round_no: int | None,
        consumer: str | None = None,
        terms: dict[str, Any] | None = None,
        *,
        one_api: bool = False,
        group: str = "ours",
        note: str = "",
        probe: Callable[[], Awaitable[int]] | None = None,
        floor: bool = False,
    ) -> Measured:
        """`floor`: against the bare floor route (bench/floor.py) instead of the API."""
        s, env = self.s, self.env
        consumer = consumer or PULL_CONSUMER[ack]
        ports, api_pids = (await self.floor_processes()) if floor else (env.api_ports, None)
        await env.backlog(
            consumer, self.need(consumer, s.warmup + s.duration + 3, s.batch * s.pollers * 4)
        )
        await db.vacuum(env.conn, "job")
        spec = {
            "mode": "pull",
            "ports": ports[:1] if one_api else ports,
            "warmup": s.warmup,
            "duration": s.duration,
            "workers": s.pollers,
            "batch": s.batch,
            "ack": ack,
            "terms": terms or {},
            **env.consumer_spec(consumer),
        }
        label = "batch ack" if ack == "batch" else "one ack POST per job"
        name = f"HTTP pull({s.batch}) + {label}, {s.pollers} pollers"
        if terms:
            name += f", overflow consumer, {json.dumps(terms)}"
        if one_api:
            name += ", one API process"
        name += note
        if round_no is not None:
            name += f" [round {round_no}]"
        m = await self.measure_loadgen(
            name, spec, "delivered", [consumer], group, probe=probe, api_pids=api_pids
        )
        await self.exhausted(m, consumer)
        if m.rate > 0:
            self.rates[consumer] = m.rate
        return m

    async def overflow(self) -> None:
        """What overflow terms cost a claim: the same pull + batch ack against a plain
        consumer and against an overflow consumer whose pulls carry min_pending (each round
        counts the consumer's due jobs, capped, before it claims), back to back."""
        s = self.s
        for round_no in range(1, s.rounds + 1):
            plain = await self.http_pull("batch", round_no)
            # The plain run's rate sizes the overflow run's backlog (same order of rate).
            self.rates.setdefault("overflow", plain.rate or self.rates["pull-batch"])
            over = await self.bigger_if_dry(
                functools.partial(
                    self._http_pull_once,
                    "batch",
                    round_no,
                    "overflow",
                    {"group": "jobs", "min_pending": 1},
                ),
                "overflow",
                2.0,
            )
            if plain.rate and over.status == "ok":
                self.pairs.setdefault("overflow", []).append(
                    {
                        "ceiling": round(plain.rate, 1),
                        "ours": round(over.rate, 1),
                        "ratio": round(over.rate / plain.rate, 4),
                    }
                )

    async def console(self) -> None:
        """What open console pages cost the pull path (issue 38): pull + batch ack with no
        page open, then with CONSOLE_PAGES pages holding the overview's live stream
        (devtools/console_pages.py, spread over the API processes), back to back, `rounds`
        times. The goal: the fall is no more than the plain runs' round-to-round spread. The
        console's statements in each window come from pg_stat_statements."""
        s, env = self.s, self.env
        urls = [f"http://127.0.0.1:{port}" for port in env.api_ports]
        for round_no in range(1, s.rounds + 1):
            plain = await self.http_pull("batch", round_no)
            async with ConsolePages(urls, CONSOLE_PAGES) as pages:
                before = pages.fewest_updates()
                watched = await self.bigger_if_dry(
                    functools.partial(
                        self._http_pull_once,
                        "batch",
                        round_no,
                        group="console",
                        note=f", {CONSOLE_PAGES} console pages open",
                        probe=self._console_statements,
                    ),
                    PULL_CONSUMER["batch"],
                    2.0,
                )
                if pages.failed():
                    raise RuntimeError("console pages failed: " + "; ".join(pages.failed()))
                watched.extra["page_updates"] = pages.fewest_updates() - before
            statements = watched.extra.get("probe", 0)
            per_s = statements / watched.seconds if watched.seconds else 0.0
            watched.extra["console_statements_per_s"] = round(per_s, 2)
            if plain.rate and watched.status == "ok":
                self.pairs.setdefault("console", []).append(
                    {
                        "ceiling": round(plain.rate, 1),
                        "ours": round(watched.rate, 1),
                        "ratio": round(watched.rate / plain.rate, 4),
                        "console_statements_per_s": round(per_s, 2),
                    }
                )

    async def _console_statements(self) -> int:
        """The console's statements pg_stat_statements has counted since its last reset."""
        rows = await (await self.env.conn.execute(STATEMENTS_SQL)).fetchall()
        counted = {int(q): (str(text), int(calls)) for q, text, calls in rows}
        return console_cost({}, counted, 1.0).statements

    async def consume(self) -> None:
        """The client's consume(), a handler that calls ack() for each job (the client
        coalesces them), against the raw pull(batch) + batch ack loop of `pollers` pollers:
        one client process and one API process each, back to back, `rounds` times."""
        s = self.s
        for round_no in range(1, s.rounds + 1):
            raw = await self.bigger_if_dry(
                functools.partial(
                    self._http_pull_once,
                    "batch",
                    round_no,
                    "consume-raw",
                    one_api=True,
                    group="baseline",
                ),
                "consume-raw",
                2.0,
            )
            mine = await self.bigger_if_dry(
                functools.partial(self._consume_once, round_no), "consume", 2.0
            )
            if raw.rate and mine.status == "ok":
                self.pairs.setdefault("consume", []).append(
                    {
                        "ceiling": round(raw.rate, 1),
                        "ours": round(mine.rate, 1),
                        "ratio": round(mine.rate / raw.rate, 4),
                    }
                )

    async def _consume_once(self, round_no: int) -> Measured:
        s, env = self.s, self.env
        consumer = "consume"
        await env.backlog(consumer, self.need(consumer, s.warmup + s.duration + 3, 20_000))
        await db.vacuum(env.conn, "job")
        spec = {
            "mode": "consume",
            "ports": env.api_ports[:1],
            "warmup": s.warmup,
            "duration": s.duration,
            "max_messages": CONSUME_MAX_MESSAGES,
            "concurrency": CONSUME_CONCURRENCY,
            **env.consumer_spec(consumer),
        }
        name = (
            f"client consume(max_messages={CONSUME_MAX_MESSAGES}, concurrency="
            f"{CONSUME_CONCURRENCY}) + ack() per job, one API process [round {round_no}]"
        )
        m = await self.measure_loadgen(name, spec, "delivered", [consumer])
        await self.exhausted(m, consumer)
        if m.rate > 0:
            self.rates[consumer] = m.rate
        return m

    async def http_publish(self, round_no: int | None = None, *, floor: bool = False) -> Measured:
        s, env = self.s, self.env
        ports, api_pids = (await self.floor_processes()) if floor else (env.api_ports, None)
        await db.vacuum(env.conn, "job")
        spec = {
            "mode": "publish",
            "ports": ports,
            "warmup": s.warmup,
            "duration": s.duration,
            "workers": s.publishers,
            "payload": db.payload(),
            **env.producer_spec("pub"),
        }
        name = f"HTTP publish, fan-out {len(PUB_CONSUMERS)}, {s.publishers} publishers"
        if floor:
            name += FLOOR_NOTE
        if round_no is not None:
            name += f" [round {round_no}]"
        m = await self.measure_loadgen(
            name,
            spec,
            "created",
            list(PUB_CONSUMERS),
            group="floor" if floor else "ours",
            api_pids=api_pids,
        )
        m.extra["messages_per_s"] = round(m.rate / len(PUB_CONSUMERS), 1)
        return self.keep(m)

    async def measure_loadgen(
        self,
        name: str,
        spec: dict[str, Any],
        kind: str,
        consumers: list[str],
        group: str = "ours",
        with_profile: str | None = None,
        probe: Callable[[], Awaitable[int]] | None = None,
        api_pids: list[int] | None = None,
    ) -> Measured:
        """`probe`: a count read at the window's end, after PostgreSQL's statement counts were
        reset at its start (so a count of statements is the window's), into extra["probe"].
        `api_pids`: the processes metered as `api` (the broker's API processes unless given)."""
        env = self.env
        meter = env.meter(api_pids)
        profiling: asyncio.Task[dict[str, Any]] | None = None
        if with_profile and self.s.profile and env.broker is not None:
            pid = env.broker.apis[0].pid
            out = env.workdir / f"pyspy-{with_profile}.txt"
            seconds = spec["warmup"] + spec["duration"]
            profiling = asyncio.create_task(profile.record(pid, seconds, out))
        marks: list[int] = []
        result, window, statements = await env.run_loadgen(
            spec,
            meter,
            within=spec.get("warmup", 0) + spec.get("duration", 0) + 180,
            probe=probe,
            marks=marks,
        )
        pks = [env.pks[c] for c in consumers]
        jobs = await db.count_jobs(env.conn, kind, pks, window)
        m = Measured(
            name,
            group,
            jobs=jobs,
            seconds=window.seconds,
            latency_ms=result.get("latency_ms", {}),
            cpu=meter.percent(),
            extra={
                "client": {k: v for k, v in result.items() if k != "latency_ms"},
                "statements": statements[:STATUS_ACTIVE_HEAD],
                "statements_per_job": round(sum(st["calls"] for st in statements) / jobs, 2)
                if jobs
                else None,
            },
        )
        if spec["mode"] in HTTP_MODES:
            m.extra["requests"] = http_requests(m.latency_ms)
        if probe is not None and marks:
            m.extra["probe"] = marks[-1]
        if result.get("errors"):
            m.notes.append(
                f"{result['counts'].get('errors', 0)} client errors, first: "
                f"{result['errors'][0][:200]}"
            )
        if profiling is not None:
            self.profiles[with_profile or name] = await profiling
        return m

    async def paired_rounds(self) -> None:
        """Ceiling and ours back to back, `rounds` times: the ratios are medians of pairs."""
        s = self.s
        for round_no in range(1, s.rounds + 1):
            self.say(f"paired round {round_no}/{s.rounds}")
            for ours, script in PAIRS.items():
                if not s.wants(ours):
                    continue
                clients = self.best_clients.get(script, 4)
                ceiling = await self.pgbench(
                    script,
                    clients,
                    f"pgbench {self.label(script)}, {clients} clients [round {round_no}]",
                )
                tag = ours if round_no == 1 else None
                if ours == "publish":
                    mine = await self.http_publish(round_no)
                else:
                    mine = await self.http_pull(
                        "batch" if ours == "pull-batch" else "each", round_no
                    )
                if s.wants("floor"):
                    await self.floor_pair(ours, mine, round_no)
                if tag and s.profile and not self.profiles.get(tag):
                    # One more run of ours under py-spy (kept out of the ratios).
                    await self.profiled(ours)
                self.paired_runs.setdefault(ours, []).append(mine)
                self.pairs.setdefault(ours, []).append(
                    {
                        "ceiling": round(ceiling.rate, 1),
                        "ours": round(mine.rate, 1),
                        "ratio": round(mine.rate / ceiling.rate, 4) if ceiling.rate else 0.0,
                        "ceiling_clients": clients,
                        **(paired_latency(mine, ceiling) if ours == "pull-batch" else {}),
                    }
                )

    async def floor_processes(self) -> tuple[list[int], list[int]]:
        """The bare floor's processes (bench/floor.py), as many as the API's, on the broker's
        config; started on first use, stopped with everything else. Their ports and pids."""
        env = self.env
        if not self.floor_services:
            assert env.broker is not None
            for i in range(len(env.api_ports)):
                port = free_port()
                service = Service(
                    f"floor{i}",
                    [sys.executable, "-m", "bench.floor", "--config", str(env.broker.config)],
                    logdir=env.workdir,
                    env={"WEBHOOK_BROKER__HTTP__LISTENER": f"127.0.0.1:{port}"},
                    cwd=REPO,
                )
                await service.start()
                env.extra_services.append(service)
                await wait_http(service, port)
                self.floor_services.append((port, service))
        return [p for p, _ in self.floor_services], [s.pid for _, s in self.floor_services]

    async def floor_pair(self, ours: str, mine: Measured, round_no: int) -> None:
        """The bare floor run of the same load right after ours (issue 40): the API CPU per
        request of both, side by side."""
        if ours == "publish":
            floor = self.keep(await self.http_publish(round_no, floor=True))
        else:
            ack = "batch" if ours == "pull-batch" else "each"
            floor = await self.bigger_if_dry(
                functools.partial(
                    self._http_pull_once,
                    ack,
                    round_no,
                    group="floor",
                    note=FLOOR_NOTE,
                    floor=True,
                ),
                PULL_CONSUMER[ack],
                2.0,
            )
        ours_us, floor_us = mine.api_us_per_request, floor.api_us_per_request
        if ours_us and floor_us:
            self.pairs.setdefault(f"floor {ours}", []).append(
                {
                    "ceiling": round(floor_us, 1),
                    "ours": round(ours_us, 1),
                    "ratio": round(ours_us / floor_us, 4),
                }
            )

    async def profiled(self, ours: str) -> None:
        s, env = self.s, self.env
        if ours == "publish":
            spec: dict[str, Any] = {
                "mode": "publish",
                "ports": env.api_ports[:1],
                "warmup": 1.0,
                "duration": s.duration,
                "workers": s.publishers,
                "payload": db.payload(),
                **env.producer_spec("pub"),
            }
            kind, consumers = "created", list(PUB_CONSUMERS)
        else:
            consumer = ours
            await env.backlog(consumer, self.need(consumer, s.duration + 4, 10_000))
            spec = {
                "mode": "pull",
                "ports": env.api_ports[:1],
                "warmup": 1.0,
                "duration": s.duration,
                "workers": s.pollers,
                "batch": s.batch,
                "ack": "batch" if ours == "pull-batch" else "each",
                **env.consumer_spec(consumer),
            }
            kind, consumers = "delivered", [consumer]
        self.say(f"  profiling {ours} with py-spy (one API process, not in the ratios)")
        m = await self.measure_loadgen(
            f"{ours} under py-spy", spec, kind, consumers, group="profile", with_profile=ours
        )
        self.profiles.setdefault(ours, {})["run"] = m.as_dict()

    # -- the Go original's protocol -----------------------------------------------------------

    async def goproto(self) -> Measured:
        s, env = self.s, self.env
        consumer = "goproto"
        await env.backlog(consumer, self.need(consumer, s.warmup + s.duration + 3, 20_000))
        await db.vacuum(env.conn, "job")
        launched = await db.clock(env.conn)
        spec = {
            "mode": "goproto",
            "ports": env.api_ports,
            "warmup": s.warmup,
            "duration": s.duration,
            "workers": s.pollers,
            "limit": s.go_limit,
            **env.consumer_spec(consumer),
        }
        m = await self.measure_loadgen(
            f"Go protocol: queued-jobs(limit {s.go_limit}) + INFLIGHT + DELIVERED per job, "
            f"{s.pollers} workers",
            spec,
            "delivered",
            [consumer],
            group="baseline",
        )
        finished = await db.clock(env.conn)
        total = await db.count_jobs(
            env.conn, "delivered", [env.pks[consumer]], db.DbWindow(launched, finished)
        )
        counts = m.extra["client"].get("counts", {})
        statuses = m.extra["client"].get("statuses", {})
        if total:
            m.extra["jobs_listed_per_job_delivered"] = round(
                counts.get("jobs listed", 0) / total, 2
            )
            m.extra["delivered_posts_per_job_delivered"] = round(
                statuses.get("DELIVERED 202", 0) / total, 2
            )
        await self.exhausted(m, consumer)
        if m.rate > 0:
            self.rates[consumer] = m.rate
        return self.keep(m)

    # -- push ---------------------------------------------------------------------------------

    async def push(self) -> None:
        """Each candidate client's bare POST loop to the receiver (no database), then the
        dispatcher, back to back: push deliveries/s against the best bare loop."""
        bare = await self.post_clients(POST_CLIENTS)
        best = max(bare, key=lambda m: m.rate, default=None)
        pushes: list[Measured] = []
        ratios: list[float] = []
        loops = [best.rate] if best is not None else []
        # Then the best loop and the dispatcher back to back, `rounds` times. The pyreqwest
        # loop is bimodal on its own (31 or 49 us a request, 38,000 or 24,000/s, minutes apart,
        # while the dispatcher's cost a delivery stayed put): the target compares the median
        # dispatcher run with the fastest loop, the client's real ceiling; the pairs' ratios
        # are kept beside it.
        for round_no in range(1, self.s.rounds + 1):
            suffix = f" [round {round_no}]" if self.s.rounds > 1 else ""
            if round_no > 1 and best is not None:
                (best,) = await self.post_clients((best.extra["client"],), suffix) or (best,)
                loops.append(best.rate)
            delivered = await self._push(suffix)
            pushes.append(delivered)
            if best is not None and best.rate > 0 and delivered.status == "ok":
                ratio = delivered.rate / best.rate
                ratios.append(ratio)
                delivered.extra["round_ratio"] = round(ratio, 4)
                delivered.notes.append(f"{ratio:.1%} of the bare loop before it ({best.name})")
        if ratios and best is not None:
            first = pushes[0]
            delivered_rates = [m.rate for m in pushes if m.status == "ok"]
            ceiling = max(loops)
            first.extra["ratio_to_best_client"] = round(
                statistics.median(delivered_rates) / ceiling, 4
            )
            first.extra["round_ratios"] = [round(r, 4) for r in ratios]
            first.extra["best_client"] = best.extra.get("client")
            first.extra["best_loop_rate"] = round(ceiling)
        rates = [m.rate for m in pushes if m.rate > 0]
        if rates:
            await self._push_paced(statistics.median(rates) / 2)

    async def _push_paced(self, rate: float) -> Measured:
        """Jobs arriving at `rate` a second (half what the dispatcher reached flat out), each
        tick's with a NOTIFY as a publish sends: claim-to-delivered and publish-to-delivered."""
        s, env = self.s, self.env
        assert env.broker is not None
        pk = env.pks[PUSH_CONSUMER]
        # What the flat-out run left queued would be delivered first: a backlog, not a load.
        await env.conn.execute(
            "DELETE FROM job WHERE consumer_pk = %s AND status = 'QUEUED'", (pk,)
        )
        await db.vacuum(env.conn, "job")
        tick = 0.05
        per_tick = max(1, round(rate * tick))
        meter = env.meter()
        meter.add("receiver", env.receiver.pid)
        dispatchers = await env.broker.start_dispatcher(s.push_dispatchers, PUSH_WINDOW)
        for dispatcher in dispatchers:
            meter.add("dispatcher", dispatcher.pid)
        try:
            await asyncio.sleep(s.warmup + 2.0)
            meter.start()
            start = await db.clock(env.conn)
            loop = asyncio.get_running_loop()
            began = loop.time()
            ticks = 0
            while loop.time() - began < s.duration:
                await db.insert_jobs(
                    env.conn,
                    channel=PUSH_CHANNEL,
                    producer=PRODUCER,
                    consumer_pks=[pk],
                    count=per_tick,
                )
                await env.conn.execute(f"SELECT pg_notify('{NOTIFY}', %s)", (str(pk),))
                ticks += 1
                await asyncio.sleep(max(0.0, began + ticks * tick - loop.time()))
            end = await db.clock(env.conn)
            await asyncio.sleep(3.0)  # the last ticks' deliveries land
            meter.stop()
        finally:
            await env.broker.stop_dispatcher()
        window = db.DbWindow(start, end)
        m = Measured(
            f"push at half that load ({per_tick / tick:,.0f} jobs/s offered)",
            "ours",
            jobs=await db.count_jobs(env.conn, "delivered", [pk], window),
            seconds=window.seconds,
            latency_ms={
                "claim_to_delivered": await db.delivery_latency(env.conn, pk, window),
                "publish_to_delivered": await db.delivery_latency(
                    env.conn, pk, window, since="created_at"
                ),
            },
            cpu=meter.percent(),
        )
        return self.keep(m)

    async def post_clients(self, clients: Sequence[str], suffix: str = "") -> list[Measured]:
        s, env = self.s, self.env
        out = []
        for client in clients:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.post_clients",
                client,
                f"http://127.0.0.1:{env.receiver_port}/hook",
                "--concurrency",
                str(PUSH_WINDOW),
                "--seconds",
                str(s.duration),
                "--warmup",
                str(s.warmup),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            stdout, stderr = await proc.communicate()
            if proc.returncode != 0:
                self.say(f"  {client}: failed: {stderr.decode()[-300:]}")
                continue
            result = json.loads(stdout.decode().strip().splitlines()[-1])
            m = Measured(
                f"bare POST loop, {client}, {PUSH_WINDOW} in flight (no database){suffix}",
                "baseline",
                jobs=result["requests"],
                seconds=result["seconds"],
                extra={
                    "client": client,
                    "cpu_us_per_request": round(
                        1e6 * result["cpu_seconds"] / max(1, result["requests"]), 1
                    ),
                    "main_thread_us_per_request": round(
                        1e6 * result["main_thread_cpu_seconds"] / max(1, result["requests"]), 1
                    ),
                    "errors": result["errors"],
                },
            )
            out.append(self.keep(m))
        return out

    async def _push(self, suffix: str = "") -> Measured:
        s, env = self.s, self.env
        assert env.broker is not None
        warm = s.warmup + 2.0  # the dispatcher process starts inside the warm-up
        await env.backlog(PUSH_CONSUMER, self.need("push", warm + s.duration + 3, 10_000))
        # The messages too: the backlog's new ones set off autovacuum inside the round.
        await db.vacuum(env.conn, "job", "message")
        meter = env.meter()
        meter.add("receiver", env.receiver.pid)
        dispatchers = await env.broker.start_dispatcher(s.push_dispatchers, PUSH_WINDOW)
        for dispatcher in dispatchers:
            meter.add("dispatcher", dispatcher.pid)
            meter.add_main_thread("dispatcher", dispatcher.pid)
        try:
            await asyncio.sleep(warm)
            for dispatcher in dispatchers:
                if not dispatcher.alive():
                    raise RuntimeError(f"dispatcher exited:\n{dispatcher.log_tail()}")
            meter.start()
            start = await db.clock(env.conn)
            await db.statements_reset(env.conn)
            profiling = None
            if s.profile:
                out = env.workdir / "pyspy-dispatcher.txt"
                profiling = asyncio.create_task(profile.record(dispatchers[0].pid, s.duration, out))
            await asyncio.sleep(s.duration)
            meter.stop()
            if profiling is not None:
                self.profiles["push dispatcher"] = await profiling
            end = await db.clock(env.conn)
            statements = await db.statements(env.conn, DBNAME)
        finally:
            await env.broker.stop_dispatcher()
        window = db.DbWindow(start, end)
        pk = env.pks[PUSH_CONSUMER]
        jobs = await db.count_jobs(env.conn, "delivered", [pk], window)
        m = Measured(
            f"push delivery to a local receiver ({s.push_dispatchers} dispatcher"
            f"{'s' if s.push_dispatchers > 1 else ''}, {PUSH_WINDOW} in flight){suffix}",
            "ours",
            jobs=jobs,
            seconds=window.seconds,
            latency_ms={"claim_to_delivered": await db.delivery_latency(env.conn, pk, window)},
            cpu=meter.percent(),
            extra={"statements": statements[:STATUS_ACTIVE_HEAD]},
        )
        await self.exhausted(m, PUSH_CONSUMER)
        if m.rate > 0:
            self.rates["push"] = m.rate
            busy = m.cpu.get("dispatcher", 0.0) / 100.0  # cores, all dispatchers together
            m.extra["dispatcher_cpu_us_per_delivery"] = round(1e6 * busy / m.rate, 1)
            main = m.cpu.get("dispatcher main thread", 0.0) / 100.0
            m.extra["dispatcher_main_thread_us_per_delivery"] = round(1e6 * main / m.rate, 1)
            m.notes.append(
                f"dispatcher CPU {m.extra['dispatcher_cpu_us_per_delivery']} us a delivery"
                f" ({m.extra['dispatcher_main_thread_us_per_delivery']} in its main thread)"
            )
        return self.keep(m)

    # -- long polls -----------------------------------------------------------------------------

    async def wakeup(self) -> None:
        """The long poll's wake-up, then the streaming pull's beside it."""
        await self._wakeup(stream=False)
        await self._wakeup(stream=True)

    async def _wakeup(self, *, stream: bool) -> Measured:
        s, env = self.s, self.env
        spec = {
            "mode": "wakeup",
            "stream": stream,
            "ports": env.api_ports,
            "samples": s.wake_samples,
            "warmup_samples": 5,
            "settle": 0.1,
            **env.consumer_spec("wake"),
            "producer": "bp",
            "producer_token": "tok-bp",
        }
        meter = env.meter()
        result, window, statements = await env.run_loadgen(
            spec, meter, within=s.wake_samples * 2 + 120
        )
        lat = result.get("latency_ms", {})
        what = (
            "streaming pull wake-up: publish -> job line"
            if stream
            else ("long-poll wake-up: publish -> waiting pull")
        )
        m = Measured(
            f"{what} ({s.wake_samples} samples)",
            "ours",
            jobs=lat.get("wakeup", {}).get("n", 0),
            seconds=window.seconds,
            latency_ms=lat,
            cpu=meter.percent(),
            extra={"client": {k: v for k, v in result.items() if k != "latency_ms"}},
        )
        m.notes.append("jobs/s is not the point here: each sample is one publish + one pull")
        if result.get("errors"):
            m.notes.append(f"client errors: {result['errors'][:3]}")
        return self.keep(m)

    async def idle(self) -> None:
        """The idle long-pollers, then the same with 1,000 scheduled messages waiting for their
        time (hours ahead): a scheduled job is a job not yet due, so it must cost nothing while
        it waits (no polling scheduler, no early wake-ups)."""
        plain = await self._idle(scheduled=0)
        if not self.s.wants("idle-scheduled"):
            return
        await self._schedule(IDLE_SCHEDULED)
        with_scheduled = await self._idle(scheduled=IDLE_SCHEDULED)
        base = plain.extra["statements_per_s"]
        with_scheduled.extra["ratio_to_idle"] = (
            round(with_scheduled.extra["statements_per_s"] / base, 3) if base else None
        )

    async def _schedule(self, count: int) -> None:
        """`count` messages on the idle channel, due 1 to 24 hours from now, over HTTP."""
        spec = self.env.producer_spec("idlech")
        headers = {
            "X-Broker-Channel-Token": spec["channel_token"],
            "X-Broker-Producer-ID": spec["producer"],
            "X-Broker-Producer-Token": spec["producer_token"],
            "Content-Type": "application/json",
        }
        now = await db.clock(self.env.conn)
        conn = Connection(self.env.api_ports[0])
        try:
            for n in range(count):
                due = now + timedelta(hours=1) + timedelta(hours=23) * n / count
                response = await conn.request(
                    "POST",
                    "/channel/idlech/broadcast",
                    body=b'{"later": true}',
                    headers={**headers, "X-Broker-Scheduled-For": due.isoformat()},
                )
                if response.status != 201:
                    raise RuntimeError(f"scheduled publish: {response.status}")
        finally:
            await conn.close()

    async def _idle(self, *, scheduled: int) -> Measured:
        s, env = self.s, self.env
        quiet = max(2.0, s.duration / 2)
        await db.statements_reset(env.conn)
        await asyncio.sleep(quiet)
        baseline = sum(st["calls"] for st in await db.statements(env.conn, DBNAME)) / quiet
        spec = {
            "mode": "idle",
            "ports": env.api_ports,
            "warmup": 2.0,
            "duration": s.duration,
            "pollers": s.idle_pollers,
            **env.consumer_spec("idle"),
        }
        meter = env.meter()
        result, window, statements = await env.run_loadgen(spec, meter, within=s.duration + 120)
        calls = sum(st["calls"] for st in statements)
        per_second = calls / window.seconds if window.seconds else 0.0
        waiting = f", {scheduled:,} scheduled messages waiting" if scheduled else ""
        m = Measured(
            f"{s.idle_pollers} idle long-pollers{waiting} (database statements/s)",
            "ours",
            jobs=0,
            seconds=window.seconds,
            cpu=meter.percent(),
            extra={
                "statements_per_s": round(per_second, 2),
                "statements_per_s_without_pollers": round(baseline, 2),
                "statements_per_s_due_to_pollers": round(max(0.0, per_second - baseline), 2),
                "statements": statements[:STATUS_ACTIVE_HEAD],
                "client": result,
            },
        )
        m.notes.append(
            f"{per_second:.1f} statements/s with the pollers waiting, {baseline:.1f}/s without "
            "(sweeper)"
        )
        return self.keep(m)

    # -- NATS JetStream, and the bridge ----------------------------------------------------------

    async def nats_pairs(self) -> None:
        """Real JetStream and the bridge (client mode, then hybrid) back to back, `rounds` times,
        like the ceiling pairs: each bridge mode's ratio is the median of the rounds' ratios
        (either runs alone when the other is not wanted)."""
        s = self.s
        for round_no in range(1, s.rounds + 1):
            suffix = f" [round {round_no}]" if s.rounds > 1 else ""
            js = await self.jetstream(suffix) if s.wants("jetstream") else None
            for key, hybrid in (("bridge", False), ("bridge-hybrid", True)):
                if not s.wants(key):
                    continue
                bridge = await self.bridge(suffix, hybrid=hybrid)
                if bridge.status != "ok":
                    return  # not available or failed: once says it
                if js is not None and js.rate:
                    self.pairs.setdefault(key, []).append(
                        {
                            "ceiling": round(js.rate, 1),
                            "ours": round(bridge.rate, 1),
                            "ratio": round(bridge.rate / js.rate, 4),
                        }
                    )

    async def jetstream(self, suffix: str = "") -> Measured:
        """Real JetStream; run again, once, with a bigger stream if the backlog ran dry."""
        return await self.bigger_if_dry(lambda: self._jetstream_once(suffix), "jetstream", 1.6)

    async def _jetstream_once(self, suffix: str) -> Measured:
        import nats

        s, env = self.s, self.env
        nc = await nats.connect(env.nats_url)
        try:
            js = nc.jetstream()
            with contextlib.suppress(Exception):
                await js.delete_stream("BENCH")
            await js.add_stream(
                name="BENCH", subjects=["bench.jobs"], retention="workqueue", storage="file"
            )
            await js.add_consumer(
                "BENCH",
                durable_name="bench",
                ack_policy="explicit",
                max_ack_pending=100_000,
                ack_wait=60,
            )
            count = self.need("jetstream", s.warmup + s.duration + 1, 50_000)
            await self.fill_stream(nc, js, count)
            spec = {
                "mode": "jetstream",
                "nats_url": env.nats_url,
                "stream": "BENCH",
                "durable": "bench",
                "batch": s.batch,
                "warmup": s.warmup,
                "duration": s.duration,
                "workers": s.pollers,
            }
            meter = env.meter()
            meter.add("nats", env.nats.pid)
            marks: list[int] = []

            async def stream_messages() -> int:
                return int((await js.stream_info("BENCH")).state.messages)

            m = await self.measure_nats(
                f"NATS JetStream: nats-py fetch({s.batch}) + ack(), {s.pollers} pullers{suffix}",
                spec,
                meter,
                stream_messages,
                marks,
            )
            m.jobs = marks[0] - marks[1] if len(marks) == 2 else 0
            if len(marks) == 2:
                left_over(m, marks[1], "messages_left")
            else:
                m.extra["messages_left"] = None
        finally:
            await nc.close()
        if m.rate > 0:
            self.rates["jetstream"] = m.rate
        return m

    async def fill_stream(self, nc: Any, js: Any, count: int) -> None:
        """`count` messages in the stream. Core publishes are not flow-controlled and JetStream
        may drop some under a burst, so publish, see what was stored, and top up."""
        body = db.payload().encode()
        deadline = time.monotonic() + 120
        stored = 0
        while stored < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"JetStream stored {stored} of {count} messages in 2 minutes")
            for i in range(count - stored):
                await nc.publish("bench.jobs", body)
                if i % 2000 == 1999:
                    await nc.flush()
            await nc.flush()
            previous = -1
            while stored != previous:  # until the stream stops growing
                previous = stored
                await asyncio.sleep(0.3)
                stored = int((await js.stream_info("BENCH")).state.messages)

    async def measure_nats(
        self,
        name: str,
        spec: dict[str, Any],
        meter: CpuMeter,
        probe: Callable[[], Awaitable[int]],
        marks: list[int],
    ) -> Measured:
        """Like measure_loadgen, with a server-side count (`probe`) at both window edges."""
        result, window, _ = await self.env.run_loadgen(
            spec,
            meter,
            within=spec["warmup"] + spec["duration"] + 180,
            probe=probe,
            marks=marks,
        )
        m = Measured(
            name,
            "baseline",
            seconds=window.seconds,
            latency_ms=result.get("latency_ms", {}),
            cpu=meter.percent(),
            extra={"client": {k: v for k, v in result.items() if k != "latency_ms"}},
        )
        if result.get("errors"):
            m.notes.append(f"client errors: {result['errors'][:2]}")
        return m

    async def bridge(self, suffix: str = "", *, hybrid: bool = False) -> Measured:
        """The bridge in one mode; run again, once, with a bigger backlog if it ran dry (a
        dry run's rate is only a lower bound, and its ratio to JetStream with it)."""
        key = "bridge-hybrid" if hybrid else "bridge"
        return await self.bigger_if_dry(lambda: self._bridge_once(suffix, hybrid, key), key, 1.6)

    async def _bridge_once(self, suffix: str, hybrid: bool, key: str) -> Measured:
        s, env = self.s, self.env
        mode = "hybrid" if hybrid else "client"
        name = (
            f"NATS bridge ({mode}): nats-py fetch({s.batch}) + ack(), {s.pollers} pullers{suffix}"
        )
        async with self.bridged(name, hybrid=hybrid) as (m, bridge, server, url):
            if m is not None:
                return m
            consumer = "natshy" if hybrid else "natsbr"
            await env.backlog(consumer, self.need(key, s.warmup + s.duration + 3, 20_000))
            await db.vacuum(env.conn, "job")
            spec = {
                "mode": "jetstream",
                "nats_url": url,
                "stream": "bench",
                "durable": consumer,
                "batch": s.batch,
                "warmup": s.warmup,
                "duration": s.duration,
                "workers": s.pollers,
            }
            meter = env.meter()
            meter.add("bridge", bridge.pid)
            meter.add("nats", server.pid)
            profiling = None
            if s.profile and "bridge" not in self.profiles:
                # Sampled through the window (after the warm-up), alongside the measured run.
                profiling = asyncio.create_task(
                    self.delayed_profile(bridge.pid, s.warmup, s.duration, "bridge")
                )
            result, window, statements = await env.run_loadgen(
                spec, meter, within=s.warmup + s.duration + 180
            )
            if profiling is not None:
                self.profiles["bridge"] = await profiling
            jobs = await db.count_jobs(env.conn, "delivered", [env.pks[consumer]], window)
            m = Measured(
                name,
                "ours",
                jobs=jobs,
                seconds=window.seconds,
                latency_ms=result.get("latency_ms", {}),
                cpu=meter.percent(),
                extra={
                    "client": {k: v for k, v in result.items() if k != "latency_ms"},
                    "statements": statements[:STATUS_ACTIVE_HEAD],
                },
            )
            if result.get("errors"):
                m.notes.append(f"client errors: {result['errors'][:2]}")
            if jobs == 0:
                m.status = "failed"
                m.notes.append(f"no job delivered through the bridge: {bridge.log_tail(5)[-400:]}")
            await self.exhausted(m, consumer)
            return m
        raise AssertionError("unreachable")  # mypy: the context manager may swallow

    @contextlib.asynccontextmanager
    async def bridged(
        self, name: str, *, hybrid: bool
    ) -> AsyncIterator[tuple[Measured | None, Service, Service, str]]:
        """A plain NATS server (no JetStream, so $JS.API is the bridge's to answer; with a
        leafnode port when `hybrid`) and `webhook-broker bridge` on it. Yields a Measured when
        the bridge is not available or did not start, else None."""
        env = self.env
        assert env.broker is not None
        available, reason = await asyncio.to_thread(
            bridge_available, env.broker.config, env.workdir
        )
        port = free_port()
        argv = [env.nats.argv[0], "-a", "127.0.0.1", "-p", str(port)]
        leaf_url = None
        if hybrid:
            leaf_port = free_port()
            conf = env.workdir / "nats-leaf.conf"
            conf.write_text(f"leafnodes {{ listen: 127.0.0.1:{leaf_port} }}\n")
            argv += ["-c", str(conf)]
            leaf_url = f"nats-leaf://127.0.0.1:{leaf_port}"
        server = Service("nats-bridge-server", argv, logdir=env.workdir)
        if not available:
            m = Measured(name, "ours", status="not available")
            m.notes.append(f"`webhook-broker bridge`: {reason}")
            yield m, server, server, ""
            return
        env.extra_services.append(server)
        await server.start()
        await wait_port(port, server)
        url = f"nats://127.0.0.1:{port}"
        bridge = await env.broker.start_bridge(url, leaf_url)
        try:
            await asyncio.sleep(3.0)
            if not bridge.alive():
                m = Measured(name, "ours", status="failed")
                m.notes.append(f"bridge exited: {bridge.log_tail(5)[-400:]}")
                yield m, bridge, server, url
            else:
                yield None, bridge, server, url
        finally:
            await bridge.stop()
            await server.stop()

    async def redelivery(self) -> None:
        """A lapsed message's way back: real JetStream, then the bridge in hybrid mode."""
        import nats

        env = self.env
        nc = await nats.connect(env.nats_url)
        try:
            js = nc.jetstream()
            with contextlib.suppress(Exception):
                await js.delete_stream("REDELIVER")
            await js.add_stream(name="REDELIVER", subjects=["redeliver.jobs"], storage="file")
            await js.add_consumer(
                "REDELIVER",
                durable_name="redeliver",
                ack_policy="explicit",
                ack_wait=redelivery.ACK_WAIT,
            )

            async def publish_one() -> None:
                await js.publish("redeliver.jobs", db.payload().encode())

            await self.redelivered(
                "NATS JetStream", "baseline", env.nats_url, "REDELIVER", publish_one
            )
        finally:
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream("REDELIVER")
            await nc.close()
        name = redelivery_name("NATS bridge (hybrid)")
        async with self.bridged(name, hybrid=True) as (failed, _, _, url):
            if failed is not None:
                self.keep(failed)
                return

            async def queue_one() -> None:
                await env.backlog("redeliver", 1)

            await self.redelivered("NATS bridge (hybrid)", "ours", url, "bench", queue_one)

    async def redelivered(
        self,
        who: str,
        group: str,
        url: str,
        stream: str,
        refill: Callable[[], Awaitable[None]],
    ) -> None:
        started = time.monotonic()
        lat, problems = await redelivery.past_ack_wait(url, stream, "redeliver", refill)
        m = Measured(
            redelivery_name(who),
            group,
            jobs=lat.get("n", 0),
            seconds=time.monotonic() - started,
            latency_ms={"past_ack_wait": lat},
        )
        m.notes.append("ms past the ack wait; jobs/s is not the point here")
        if problems:
            m.status = "failed"
            m.notes.insert(0, problems[0])
        self.keep(m)

    async def delayed_profile(
        self, pid: int, delay: float, seconds: float, tag: str
    ) -> dict[str, Any]:
        await asyncio.sleep(delay)
        return await profile.record(pid, seconds, self.env.workdir / f"pyspy-{tag}.txt")

    # -- pgqueuer -------------------------------------------------------------------------------

    async def pgqueuer(self) -> list[Measured]:
        s, env = self.s, self.env
        try:
            from pgqueuer import Queries
            from pgqueuer.db import PsycopgDriver
        except ImportError:
            m = Measured("pgqueuer", "baseline", status="not available")
            m.notes.append("pgqueuer is not installed (pip install -e '.[dev]')")
            return [self.keep(m)]
        queries = Queries(PsycopgDriver(env.conn))
        if not await queries.schema_is_installed():
            await queries.install()
        dsn = env.database_url
        out: list[Measured] = []
        # Enqueue: one job per call, like one publish per HTTP request.
        await db.vacuum(env.conn, "pgqueuer")
        spec: dict[str, Any] = {
            "mode": "pgqueuer_enqueue",
            "dsn": dsn,
            "workers": s.publishers,
            "payload": db.payload(),
            "warmup": s.warmup,
            "duration": s.duration,
        }
        m = await self.measure_pgq(
            f"pgqueuer enqueue (one job per call), {s.publishers} connections",
            spec,
            "SELECT count(*) FROM pgqueuer WHERE created >= %s AND created < %s",
        )
        out.append(m)
        await env.conn.execute("DELETE FROM pgqueuer")
        # Dequeue: QueueManagers draining a backlog with a no-op entrypoint.
        count = self.need("pgqueuer", s.warmup + s.duration + 3, 30_000)
        body = db.payload().encode()
        for start in range(0, count, 5000):
            n = min(5000, count - start)
            await queries.enqueue(["bench"] * n, [body] * n, [0] * n)
        await db.vacuum(env.conn, "pgqueuer")
        await db.vacuum(env.conn, "pgqueuer_log")
        spec = {
            "mode": "pgqueuer_dequeue",
            "dsn": dsn,
            "workers": s.pollers,
            "batch": s.batch,
            "warmup": s.warmup,
            "duration": s.duration,
        }
        m = await self.measure_pgq(
            f"pgqueuer dequeue (QueueManager, batch {s.batch}), {s.pollers} workers",
            spec,
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' "
            "AND created >= %s AND created < %s",
        )
        left_over(m, int(await db.scalar(env.conn, "SELECT count(*) FROM pgqueuer")))
        if m.rate > 0:
            self.rates["pgqueuer"] = m.rate
        out.append(m)
        out.append(await self.pgqueuer_as_published(dsn))
        return out

    async def pgqueuer_as_published(self, dsn: str) -> Measured:
        """pgqueuer as its own tools/benchmark.py runs by default (5 dequeuers with batch 10,
        one enqueuer adding 10 at a time, side by side): the setting its published numbers,
        and issue 7's 7-8% of the ceiling, come from."""
        s, env = self.s, self.env
        await env.conn.execute("DELETE FROM pgqueuer")
        await db.vacuum(env.conn, "pgqueuer")
        await db.vacuum(env.conn, "pgqueuer_log")
        spec = {
            "mode": "pgqueuer_mixed",
            "dsn": dsn,
            "dequeue_workers": 5,
            "dequeue_batch": 10,
            "enqueue_workers": 1,
            "enqueue_batch": 10,
            "payload": db.payload(),
            "warmup": s.warmup,
            "duration": s.duration,
        }
        return await self.measure_pgq(
            "pgqueuer as its benchmark runs (5 dequeuers batch 10, 1 enqueuer batch 10)",
            spec,
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' "
            "AND created >= %s AND created < %s",
        )

    async def measure_pgq(self, name: str, spec: dict[str, Any], count_sql: str) -> Measured:
        env = self.env
        meter = env.meter()
        result, window, statements = await env.run_loadgen(
            spec, meter, within=spec["warmup"] + spec["duration"] + 180
        )
        jobs = int(await db.scalar(env.conn, count_sql, (window.start, window.end)))
        m = Measured(
            name,
            "baseline",
            jobs=jobs,
            seconds=window.seconds,
            latency_ms=result.get("latency_ms", {}),
            cpu=meter.percent(),
            extra={
                "client": {k: v for k, v in result.items() if k != "latency_ms"},
                "statements": statements[:STATUS_ACTIVE_HEAD],
            },
        )
        if result.get("errors"):
            m.notes.append(f"client errors: {result['errors'][:2]}")
        return self.keep(m)

    # -- claim latency vs backlog -------------------------------------------------------------

    async def backlog_latency(self) -> list[Measured]:
        s, env = self.s, self.env
        per_run = s.latency_pulls * s.pollers * s.batch
        warm_pulls = 3
        consumed = per_run + warm_pulls * s.pollers * s.batch
        out = []
        for consumer, size in (("small", s.small_backlog), ("large", s.large_backlog)):
            have = await db.queued(env.conn, env.pks[consumer])
            if have < size + consumed:
                started = time.monotonic()
                self.say(f"  loading {size + consumed - have:,} jobs for '{consumer}'")
                await db.insert_jobs(
                    env.conn,
                    channel="bench",
                    producer="bp",
                    consumer_pks=[env.pks[consumer]],
                    count=size + consumed - have,
                )
                self.say(f"  loaded in {time.monotonic() - started:.1f}s")
            await db.vacuum(env.conn, "job")
            await db.vacuum(env.conn, "message")
            spec = {
                "mode": "pull",
                "ports": env.api_ports,
                "warmup": 0.0,
                "duration": 600.0,
                "workers": s.pollers,
                "batch": s.batch,
                "ack": "batch",
                "pulls": s.latency_pulls,
                "warmup_pulls": warm_pulls,
                **env.consumer_spec(consumer),
            }
            m = await self.measure_loadgen(
                f"claim latency, {size:,} queued: pull({s.batch}) + batch ack, {s.pollers} pollers",
                spec,
                "delivered",
                [consumer],
            )
            m.extra["backlog"] = size
            self.plans[f"claim, {consumer} backlog"] = await self.explain_claim(consumer)
            self.plans[
                f"pending count per pull (due_jobs_ahead), {consumer} backlog"
            ] = await self.explain_stats(consumer)
            out.append(self.keep(m))
        return out

    async def explain_claim(self, consumer: str) -> list[str]:
        """The claim an HTTP pull of this consumer runs, and the queue walk inside it."""
        env = self.env
        named = await plans.pulling(env.conn, env.consumer_spec(consumer))
        return await plans.claim_plans(env.conn, named, env.pks[consumer], batch=self.s.batch)

    async def explain_stats(self, consumer: str) -> list[str]:
        """The count of due jobs each pull reports (the claim's and the scheduler's)."""
        return await plans.pending_plan(self.env.conn, self.env.pks[consumer], self.s.batch)

    async def explain_acks(self) -> None:
        """The broker's batch ack with many jobs in flight, as slow workers or a long lease
        leave them."""
        env = self.env
        consumer = "large"
        named = await plans.pulling(env.conn, env.consumer_spec(consumer))
        self.plans["batch ack, many in flight"] = await plans.ack_plan(
            env.conn, named, batch=self.s.batch, inflight=20_000
        )

    # -- retention (issue 42) ---------------------------------------------------------------------

    async def retention(self) -> None:
        """Partition drops and today's row deletes, in alternating cycles (bench/retention.py)."""
        env = self.env
        measured = await retention.run_retention(
            env.cluster.base_url,
            env.workdir / "retention",
            retention.plan_for(self.s),
            say=self.say,
        )
        for m in measured:
            self.keep(m)

    # -- soak -----------------------------------------------------------------------------------

    async def soak(self) -> Measured:
        s, env = self.s, self.env
        consumer = "soak"
        seconds = s.soak
        # The whole soak drains one backlog loaded up front (no refill muddying the rate),
        # so it must outlast the soak at the rate measured earlier in the run.
        need = self.need("pull-batch", seconds + 10, 50_000, margin=1.2)
        self.say(f"  soak: loading {need:,} jobs")
        await env.backlog(consumer, need)
        await db.vacuum(env.conn, "job")
        spec = {
            "mode": "pull",
            "ports": env.api_ports,
            "warmup": 0.0,
            "duration": seconds,
            "workers": s.pollers,
            "batch": s.batch,
            "ack": "batch",
            **env.consumer_spec(consumer),
        }
        launched = await db.clock(env.conn)
        m = await self.measure_loadgen(
            f"soak {seconds:.0f}s: HTTP pull({s.batch}) + batch ack", spec, "delivered", [consumer]
        )
        rows = await (
            await env.conn.execute(
                "SELECT floor(extract(epoch FROM status_changed_at - %s) / 60), count(*) "
                "FROM job WHERE consumer_pk = %s AND status = 'DELIVERED' "
                "AND status_changed_at >= %s GROUP BY 1 ORDER BY 1",
                (launched, env.pks[consumer], launched),
            )
        ).fetchall()
        per_minute = [int(c) for _, c in rows]
        m.extra["delivered_per_minute"] = per_minute
        if len(per_minute) >= 3:
            first, last = per_minute[0], per_minute[-2]  # the last full minute
            m.extra["loss_first_to_last_minute"] = round(1 - last / first, 4) if first else None
        await self.exhausted(m, consumer)
        return self.keep(m)


def left_over(m: Measured, left: int, key: str = "queued_left") -> None:
    """Record what the run left queued; none left means its rate is only a lower bound."""
    m.extra[key] = left
    if left == 0:
        m.notes.append(RAN_OUT)


def shorten(lines: list[str], head: int = 24, tail: int = 8) -> list[str]:
    if len(lines) <= head + tail:
        return lines
    return [*lines[:head], f"... {len(lines) - head - tail} lines ...", *lines[-tail:]]


def paired_latency(mine: Measured, ceiling: Measured) -> dict[str, float]:
    """Pull + batch ack: a pull's latency in our run and a script's (claim + batch ack) in
    pgbench's beside it, p50 and p99 in ms (issue 40 asks ours at or under pgbench's)."""
    ours, theirs = mine.latency_ms.get("pull", {}), ceiling.latency_ms.get("script", {})
    if not ours.get("n") or not theirs.get("n"):
        return {}
    return {
        "ours_p50": ours["p50"],
        "ours_p99": ours["p99"],
        "ceiling_p50": theirs["p50"],
        "ceiling_p99": theirs["p99"],
    }


def median_ratio(pairs: list[dict[str, float]]) -> float | None:
    ratios = [p["ratio"] for p in pairs if p.get("ceiling")]
    return statistics.median(ratios) if ratios else None
