"""The broker under test: its config, seeded stakeholders, and its processes.

Every broker process is the real entry point (`python -m app`, the same code as the
`webhook-broker` command) with real HTTP on loopback; only its config file is written here.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.http1 import Connection, HttpError
from bench.procs import Service
from devtools.pg import free_port

PRODUCER = "bp"
PUB_CONSUMERS = tuple(f"pub{i}" for i in range(1, 6))
# Pull consumers of the channel `bench`; nothing publishes to it over HTTP: their backlogs are
# written by SQL, so each scenario drains a consumer of its own.
BENCH_CONSUMERS = (
    "pgb-claim",
    "pgb-batch",
    "pgb-each",
    "pull-batch",
    "pull-each",
    "goproto",
    "small",
    "large",
    "natsbr",
    "natshy",
    "redeliver",
    "overflow",
    "soak",
    "consume",
    "consume-raw",
)
# Seed settings beyond token, channel and type.
CONSUMER_SETTINGS = {
    "redeliver": {"ack-wait": "2"},
    "overflow": {"priority-groups": "jobs", "priority-policy": "overflow"},
}
PULL_CHANNELS = {
    "bench": BENCH_CONSUMERS,
    "pub": PUB_CONSUMERS,
    "wakech": ("wake",),
    "idlech": ("idle",),
}
PUSH_CHANNEL = "pushch"
PUSH_CONSUMER = "push1"


def token(name: str) -> str:
    return f"tok-{name}"


def channel_of(consumer: str) -> str:
    for channel, consumers in PULL_CHANNELS.items():
        if consumer in consumers:
            return channel
    if consumer == PUSH_CONSUMER:
        return PUSH_CHANNEL
    raise KeyError(consumer)


def config_text(database_url: str, receiver_port: int, nats_url: str) -> str:
    channels = [*PULL_CHANNELS, PUSH_CHANNEL]
    lines = [
        "[rdbms]",
        "dialect=postgresql",
        f"connection-url={database_url}",
        "[log]",
        # INFO would log a line per request (uvicorn's access log goes through the root logger).
        "log-level=warning",
        "[broker]",
        "max-workers=200",
        "[push]",
        # one consumer may use the whole window, as the bare client loops do
        "max-in-flight=200",
        "[nats]",
        f"url={nats_url}",
        "[initial-channels]",
        *(f"{c}={c}" for c in channels),
        "[initial-channel-tokens]",
        *(f"{c}={token(c)}" for c in channels),
        "[initial-producers]",
        f"{PRODUCER}={PRODUCER}",
        "[initial-producer-tokens]",
        f"{PRODUCER}={token(PRODUCER)}",
        "[initial-consumers]",
    ]
    sections: list[str] = []
    for channel, consumers in PULL_CHANNELS.items():
        for consumer in consumers:
            lines.append(f"{consumer}=")
            sections += [f"[{consumer}]", f"token={token(consumer)}", f"channel={channel}"]
            sections.append("type=pull")
            sections += [f"{k}={v}" for k, v in CONSUMER_SETTINGS.get(consumer, {}).items()]
    lines.append(f"{PUSH_CONSUMER}=http://127.0.0.1:{receiver_port}/hook")
    sections += [
        f"[{PUSH_CONSUMER}]",
        f"token={token(PUSH_CONSUMER)}",
        f"channel={PUSH_CHANNEL}",
        "type=push",
    ]
    return "\n".join(lines + sections) + "\n"


def broker_argv() -> list[str]:
    """`webhook-broker` if the console script is installed, else `python -m app` (the same)."""
    script = Path(sys.executable).parent / "webhook-broker"
    if script.exists():
        return [str(script)]
    found = shutil.which("webhook-broker")
    return [found] if found else [sys.executable, "-m", "app"]


def bridge_available(config: Path, cwd: Path) -> tuple[bool, str]:
    """Whether this checkout has `webhook-broker bridge` (another session is building it)."""
    try:
        done = subprocess.run(
            [*broker_argv(), "--config", str(config), "bridge", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=cwd,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot run: {exc}"
    if done.returncode == 0:
        return True, ""
    reason = (done.stderr.strip().splitlines() or ["no bridge command"])[-1]
    return False, reason[:200]


@dataclass
class Broker:
    workdir: Path
    database_url: str
    receiver_port: int
    nats_url: str
    api_procs: int

    def __post_init__(self) -> None:
        self.config = self.workdir / "webhook-broker.cfg"
        self.config.write_text(config_text(self.database_url, self.receiver_port, self.nats_url))
        self.api_ports = [free_port() for _ in range(self.api_procs)]
        self.apis: list[Service] = []
        self.sweeper: Service | None = None
        self.dispatchers: list[Service] = []
        self.bridge: Service | None = None

    def _service(self, name: str, command: str, env: dict[str, str] | None = None) -> Service:
        return Service(
            name,
            [*broker_argv(), "--config", str(self.config), command],
            logdir=self.workdir,
            env=env,
            cwd=self.workdir,
        )

    def migrate(self) -> None:
        done = subprocess.run(
            [*broker_argv(), "--config", str(self.config), "migrate"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.workdir,
        )
        if done.returncode != 0:
            raise RuntimeError(f"webhook-broker migrate failed:\n{done.stderr[-3000:]}")

    async def start(self) -> None:
        """API processes (each seeds on start, race-safe) and one sweeper, as deployed."""
        for i, port in enumerate(self.api_ports):
            api = self._service(
                f"api{i}", "api", {"WEBHOOK_BROKER__HTTP__LISTENER": f"127.0.0.1:{port}"}
            )
            await api.start()
            self.apis.append(api)
            # The first one seeds alone; the others find everything in place.
            if i == 0:
                await wait_http(api, port)
        for api, port in zip(self.apis, self.api_ports, strict=True):
            await wait_http(api, port)
        self.sweeper = self._service("sweeper", "sweeper")
        await self.sweeper.start()

    async def start_dispatcher(self, count: int = 1, window: int = 200) -> list[Service]:
        """`count` dispatcher processes (they share the work through the database), with
        `window` deliveries in flight between them, as many as a bare loop keeps."""
        share = str(max(1, window // count))
        env = {
            "WEBHOOK_BROKER__BROKER__MAX_WORKERS": share,
            "WEBHOOK_BROKER__PUSH__MAX_IN_FLIGHT": share,
        }
        self.dispatchers = [
            self._service(f"dispatcher{i}", "dispatcher", env) for i in range(count)
        ]
        for dispatcher in self.dispatchers:
            await dispatcher.start()
        return self.dispatchers

    async def stop_dispatcher(self) -> None:
        for dispatcher in self.dispatchers:
            await dispatcher.stop()
        self.dispatchers = []

    async def start_bridge(self, nats_url: str, leaf_url: str | None = None) -> Service:
        """The bridge on `nats_url`; with `leaf_url`, in hybrid mode (deliveries over a leafnode
        link, as nats-server makes them)."""
        env = {"WEBHOOK_BROKER__NATS__URL": nats_url}
        if leaf_url:
            env |= {
                "WEBHOOK_BROKER__NATS__MODE": "hybrid",
                "WEBHOOK_BROKER__NATS__LEAF_URL": leaf_url,
            }
        self.bridge = self._service("bridge", "bridge", env)
        await self.bridge.start()
        return self.bridge

    async def stop(self) -> None:
        for service in [*self.dispatchers, self.bridge, self.sweeper, *self.apis]:
            if service is not None:
                await service.stop()


async def wait_http(service: Service, port: int, within: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited:\n{service.log_tail()}")
        conn = Connection(port)
        try:
            response = await conn.request("GET", "/_status")
            if response.status == 200:
                return
        except (OSError, HttpError):
            pass
        finally:
            await conn.close()
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{service.name} did not answer on port {port}:\n{service.log_tail()}")
