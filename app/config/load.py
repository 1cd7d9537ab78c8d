"""Read webhook-broker.cfg (INI) into one frozen, validated Config.

Layers, later ones win key by key: built-in defaults, /etc/webhook-broker/webhook-broker.cfg,
~/.webhook-broker/webhook-broker.cfg, ./webhook-broker.cfg, --config PATH, then environment
variables WEBHOOK_BROKER__<SECTION>__<KEY> (underscores in SECTION and KEY stand for dashes,
except that a KEY of an [initial-*] section is an id and is taken as written).
Nothing is read at import time: entry points call load_config() and pass the result down.

Every key is declared once, in SECTIONS: its default, parser, help text and whether we act on
it. The defaults, the validation, the unknown-key check and webhook-broker.cfg.template
(`python -m app.config > webhook-broker.cfg.template`) all come from that table.
"""

from __future__ import annotations

import base64
import binascii
import configparser
import dataclasses
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from app.domain.callbacks import parse_callback_url
from app.domain.errors import InvalidInput
from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import ConsumerType
from app.domain.priority import NO_PRIORITY, PrioritySettings, parse_policy, priority_settings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "WEBHOOK_BROKER__"

SYSTEM_CONFIG = Path("/etc/webhook-broker/webhook-broker.cfg")
CONFIG_NAME = "webhook-broker.cfg"


def default_locations() -> tuple[Path, ...]:
    """The files read before --config, resolved when called (HOME and the working directory)."""
    return (
        SYSTEM_CONFIG,
        Path("~/.webhook-broker").expanduser() / CONFIG_NAME,
        Path.cwd() / CONFIG_NAME,
    )


class ConfigError(ValueError):
    """A config value is invalid; the message names the section, key and reason."""


# -- Parsers: each takes the stripped text of a value and raises ValueError with the reason --------


def _integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("must be a whole number") from None


def _non_negative_int(raw: str) -> int:
    value = _integer(raw)
    if value < 0:
        raise ValueError("must be zero or more")
    return value


def _positive_int(raw: str) -> int:
    value = _integer(raw)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _boolean(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _non_empty(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def _delays(raw: str) -> tuple[int, ...]:
    values = tuple(_positive_int(part.strip()) for part in raw.split(",") if part.strip())
    if not values:
        raise ValueError("needs at least one delay")
    return values


def _dialect(raw: str) -> str:
    lowered = raw.lower()
    if lowered in ("sqlite", "sqlite3"):
        return "sqlite"
    if lowered in ("postgresql", "postgres"):
        return "postgresql"
    raise ValueError("must be sqlite or postgresql")


def _listener(raw: str) -> tuple[str, int]:
    host, sep, port_text = raw.rpartition(":")
    if not sep:
        raise ValueError("must be host:port (':8080' listens on every interface)")
    port = _integer(port_text)
    if not 0 < port < 65536:
        raise ValueError("port must be between 1 and 65535")
    return (host.strip("[]") or "0.0.0.0", port)


def _optional_listener(raw: str) -> tuple[str, int] | None:
    return _listener(raw) if raw.strip() else None


def _log_format(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("text", "json"):
        raise ValueError("must be text or json")
    return value


def _log_level(raw: str) -> str:
    level = raw.upper()
    aliases = {"WARN": "WARNING", "FATAL": "CRITICAL", "PANIC": "CRITICAL", "TRACE": "DEBUG"}
    level = aliases.get(level, level)
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("must be one of debug, info, warn, error, fatal")
    return level


def _header_name(raw: str) -> str:
    if not raw or any(ch in raw for ch in " :\t\r\n"):
        raise ValueError("must be a valid HTTP header name")
    return raw


def _terminal_statuses(raw: str) -> tuple[str, ...]:
    allowed = (JobStatus.DELIVERED.value, JobStatus.DEAD.value)
    values = tuple(dict.fromkeys(part.strip().upper() for part in raw.split(",") if part.strip()))
    if not values or any(value not in allowed for value in values):
        raise ValueError("must list DELIVERED and/or DEAD")
    return values


def _gateway_mode(raw: str) -> str:
    if raw not in ("none", "hmac"):
        raise ValueError('must be "none" or "hmac"')
    return raw


def _base64_secret(raw: str) -> bytes:
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error:
        raise ValueError("must be base64") from None


def _path_prefixes(raw: str) -> tuple[str, ...]:
    prefixes = tuple(part.strip() for part in raw.split(",") if part.strip())
    for prefix in prefixes:
        if not prefix.startswith("/"):
            raise ValueError(f"{prefix!r} is not a path (it must start with /)")
    return prefixes


def _networks(raw: str) -> tuple[str, ...]:
    """Comma-separated CIDRs (an address alone is its /32 or /128), kept as written."""
    import ipaddress

    values = tuple(part.strip() for part in raw.split(",") if part.strip())
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError(f"{value!r} is not a network (CIDR such as 10.0.0.0/8)") from None
    return values


def _nats_mode(raw: str) -> str:
    if raw.lower() not in ("client", "hybrid"):
        raise ValueError("must be client or hybrid")
    return raw.lower()


def _nats_url(raw: str) -> str:
    for url in raw.split(","):
        if urlparse(url.strip()).scheme not in ("nats", "tls", "nats-leaf") or ":" not in url:
            raise ValueError("must be nats://host:port (several separated by commas)")
    return raw


def _nats_prefix(raw: str) -> str:
    if not raw or any(ch in raw for ch in " *>\t") or raw.startswith(".") or raw.endswith("."):
        raise ValueError("must be a subject prefix without wildcards, e.g. $JS.API")
    return raw


# What no webhook has a reason to reach: [push] deny-callback-networks by default.
DEFAULT_DENIED_CALLBACK_NETWORKS = (
    "0.0.0.0/8",  # "this host" / unspecified
    "169.254.0.0/16",  # IPv4 link-local: AWS, GCP, Azure, OpenStack metadata
    "100.100.100.200/32",  # Alibaba Cloud metadata
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and 255.255.255.255 broadcast
    "::/128",  # unspecified
    "fe80::/10",  # IPv6 link-local
    "fd00:ec2::254/128",  # AWS's IPv6 metadata endpoint
    "ff00::/8",  # IPv6 multicast
    "64:ff9b::a9fe:0/112",  # NAT64 (well-known prefix) of 169.254.0.0/16
    "64:ff9b::6464:64c8/128",  # NAT64 of 100.100.100.200
    "64:ff9b::/104",  # NAT64 of 0.0.0.0/8
    "64:ff9b::e000:0/99",  # NAT64 of 224.0.0.0/3 (multicast, reserved, broadcast)
)


# -- The table: every key, once -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a section; defaults, parsing, errors and the template all come from these."""

    name: str
    default: str  # as written in a file
    parse: Callable[[str], object]
    help: str
    # The field it fills on its section's dataclass, when that is not its name with underscores.
    attr: str = ""
    # False: a key of the Go original that we accept at any valid value and validate (so its
    # files load) but do not act on; setting it makes the broker log it as unused at start.
    implemented: bool = True
    # A secret: an error about its value does not repeat the value.
    secret: bool = False

    @property
    def field_name(self) -> str:
        return self.attr or self.name.replace("-", "_")


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    keys: tuple[Key, ...]
    help: str = ""


SECTIONS: tuple[Section, ...] = (
    Section(
        "rdbms",
        (
            Key("dialect", "sqlite", _dialect, "sqlite (embedded, zero setup) or postgresql."),
            Key(
                "connection-url",
                "webhook-broker.sqlite3",
                _non_empty,
                "sqlite: a file path. postgresql: postgresql://user:password@host:port/dbname",
            ),
            Key(
                "connxn-max-idle-time-seconds",
                "0",
                _non_negative_int,
                "Seconds an idle pooled connection may live (0 = no limit).",
                implemented=False,
            ),
            Key(
                "connxn-max-lifetime-seconds",
                "0",
                _non_negative_int,
                "Seconds before a pooled connection is recycled (0 = never).",
                attr="pool_recycle_seconds",
            ),
            Key(
                "max-idle-connxns",
                "10",
                _positive_int,
                "Connections kept open in the pool (PostgreSQL).",
            ),
            Key(
                "max-open-connxns",
                "20",
                _positive_int,
                "Most connections open at once (PostgreSQL).",
            ),
        ),
    ),
    Section(
        "http",
        (
            Key(
                "listener",
                "127.0.0.1:8080",
                _listener,
                'host:port to listen on; ":8080" listens on every interface, which needs an '
                "admin-token (or allow-anonymous-admin=true).",
            ),
            Key(
                "read-timeout",
                "240",
                _positive_int,
                "Seconds allowed to read a whole request, head and body (408 beyond it).",
            ),
            Key(
                "read-header-timeout",
                "10",
                _positive_int,
                "Seconds allowed for a request's head to arrive, from the connection's first "
                "byte or the end of its previous request (slow clients are disconnected).",
            ),
            Key(
                "write-timeout",
                "240",
                _positive_int,
                "Seconds a stopping server (SIGTERM) waits for in-flight requests; no per-request "
                "write timeout is applied.",
            ),
            Key(
                "max-concurrency",
                "4096",
                _positive_int,
                "Connections and requests one API process serves at once (503 beyond it).",
            ),
            Key(
                "max-body-bytes",
                "1048576",
                _positive_int,
                "Largest JSON or form body (pull, ack, management PUT) read; 413 beyond it, "
                "counted while it is read. Publishes are bounded by [broker] "
                "max-message-size-bytes.",
            ),
            Key(
                "admin-token",
                "",
                str,
                'When set, every change (PUT, DELETE, redrive, purge) needs "Authorization: '
                "Bearer <admin-token>\" (or the resource's own tokens where the API takes them), "
                "and reads need a credential too.",
                secret=True,
            ),
            Key(
                "reader-token",
                "",
                str,
                'A read-only token: "Authorization: Bearer <reader-token>" allows every GET and '
                "nothing else (dashboards, monitoring).",
                secret=True,
            ),
            Key(
                "allow-anonymous-admin",
                "false",
                _boolean,
                "Let a listener that is not loopback start without an admin-token (every change "
                "then open to whoever reaches it; warned at every start).",
            ),
            Key(
                "anonymous-reads",
                "false",
                _boolean,
                "With an admin-token or reader-token set, still let anyone read channels, "
                "consumers, producers, messages and job counts without a credential, as the "
                "Go original does (warned at every start).",
            ),
            Key(
                "token-hash-key",
                "",
                str,
                "Key of the keyed hash (HMAC-SHA256) channel and producer tokens are stored "
                "as. Empty: a random key made once and kept in the database. Changing it "
                "invalidates every stored channel and producer token.",
                secret=True,
            ),
        ),
    ),
    Section(
        "log",
        (
            Key("filename", "", str, "File the log is appended to; empty logs to stderr."),
            Key(
                "log-level",
                "info",
                _log_level,
                "debug, info, warn, error or fatal.",
                attr="level",
            ),
            Key(
                "log-format",
                "text",
                _log_format,
                "text (for a terminal) or json (one object per line, for a log pipeline).",
                attr="format",
            ),
            Key(
                "max-file-size-in-mb",
                "200",
                _non_negative_int,
                "Size at which the log file is rotated.",
                implemented=False,
            ),
            Key(
                "max-backups",
                "3",
                _non_negative_int,
                "Rotated log files kept.",
                implemented=False,
            ),
            Key(
                "max-age-in-days",
                "28",
                _non_negative_int,
                "Days rotated log files are kept.",
                implemented=False,
            ),
            Key(
                "compress-backups",
                "true",
                _boolean,
                "Whether rotated log files are compressed.",
                implemented=False,
            ),
        ),
    ),
    Section(
        "broker",
        (
            Key(
                "max-message-queue-size",
                "10000",
                _positive_int,
                "Length of the in-memory delivery queue (here jobs queue in the database).",
                implemented=False,
            ),
            Key(
                "max-workers",
                "200",
                _positive_int,
                "Push deliveries in flight at once, per dispatcher process.",
            ),
            Key(
                "priority-dispatcher-enabled",
                "true",
                _boolean,
                "Whether delivery goes by message priority (here it always does).",
                implemented=False,
            ),
            Key(
                "retrigger-base-endpoint",
                "http://localhost:8080",
                str,
                "Base URL the Go original's recovery workers call to retrigger jobs.",
                implemented=False,
            ),
            Key(
                "max-retry",
                "5",
                _non_negative_int,
                "Retries after the first delivery; the failure after the last retry dead-letters "
                "the job.",
            ),
            Key(
                "rational-delay-in-seconds",
                "2",
                _positive_int,
                "Sweeper interval, and part of the default lease (with "
                "connection-timeout-in-seconds).",
                attr="rational_delay_seconds",
            ),
            Key(
                "retry-backoff-delays-in-seconds",
                "5,30,60",
                _delays,
                "Backoff before retry k: D[k-1] while k < len(D), then (k - len(D) + 1) * D[-1].",
                attr="retry_backoff_delays",
            ),
            Key(
                "recovery-workers-enabled",
                "true",
                _boolean,
                "Whether workers requeue stuck jobs (here the sweeper always does).",
                implemented=False,
            ),
            Key(
                "max-message-size-bytes",
                "5242880",
                _positive_int,
                "Largest message body accepted by broadcast (413 beyond it).",
            ),
        ),
    ),
    Section(
        "consumer-connection",
        (
            Key(
                "token-header-name",
                "X-Broker-Consumer-Token",
                _header_name,
                "Header that carries the consumer's token on push deliveries.",
            ),
            Key("user-agent", "Webhook Message Broker", str, "User-Agent of push deliveries."),
            Key(
                "connection-timeout-in-seconds",
                "30",
                _positive_int,
                "Push request timeout; with rational-delay-in-seconds, the default ack wait of "
                "a job.",
                attr="connection_timeout_seconds",
            ),
        ),
    ),
    Section(
        "push",
        (
            Key(
                "max-in-flight",
                "100",
                _positive_int,
                "Deliveries in flight at once to one consumer, per dispatcher, unless the "
                "consumer's maxInFlight says otherwise (halved on 429/503, grown back by one per "
                "success).",
            ),
            Key(
                "retry-after-max-seconds",
                "3600",
                _positive_int,
                "Longest delay a receiver's Retry-After (on 429 or 503) may ask for.",
            ),
            Key(
                "breaker-failures",
                "5",
                _positive_int,
                "Consecutive failed deliveries that open a consumer's circuit breaker.",
            ),
            Key(
                "breaker-cooldown",
                "30",
                _positive_int,
                "Seconds an open breaker waits before one probe delivery (doubled each time "
                "it opens again, up to 32 times).",
                attr="breaker_cooldown_seconds",
            ),
            Key(
                "signing-secret-overlap",
                "86400",
                _positive_int,
                "Seconds a replaced signing secret still signs beside the new one (a PUT's "
                "signingSecretOverlap overrides it).",
                attr="signing_secret_overlap_seconds",
            ),
            Key(
                "deny-callback-networks",
                ",".join(DEFAULT_DENIED_CALLBACK_NETWORKS),
                _networks,
                "CIDRs a callback may never reach (checked on every address its host resolves "
                "to, at PUT and at delivery): link-local, cloud metadata, unspecified, "
                "broadcast, multicast, and their NAT64 forms.",
            ),
            Key(
                "deny-private-callbacks",
                "false",
                _boolean,
                "Also deny loopback, RFC 1918, CGNAT (100.64.0.0/10) and fc00::/7 callbacks, "
                "for deployments where consumers' owners are not trusted.",
            ),
            Key(
                "allow-callback-networks",
                "",
                _networks,
                "When set, a callback must resolve inside these CIDRs (deny lists still apply).",
            ),
            Key(
                "max-response-bytes",
                "65536",
                _positive_int,
                "Most bytes of a callback's answer the dispatcher reads (never decompressed).",
            ),
        ),
    ),
    Section(
        "metrics",
        (
            Key(
                "listener",
                "",
                _optional_listener,
                "host:port where a sweeper, dispatcher or bridge process serves /metrics (empty:"
                " none; API processes serve it on their HTTP port).",
            ),
        ),
    ),
    Section(
        "pull",
        (
            Key(
                "max-batch",
                "256",
                _positive_int,
                "Most jobs one pull (or one batch ack) may carry.",
            ),
            Key(
                "max-stream-batch",
                "4096",
                _positive_int,
                "Most jobs one streaming pull may ask for (it is claimed max-batch at a time).",
            ),
            Key(
                "max-expires-seconds",
                "300",
                _positive_int,
                "Longest a pull may wait for its first job.",
            ),
            Key(
                "max-waiting",
                "512",
                _positive_int,
                "Pulls that may wait on one consumer at once, per process (409 beyond it).",
            ),
            Key(
                "max-waiting-total",
                "2048",
                _positive_int,
                "Pulls that may wait at once in one process, over every consumer (409 beyond it).",
            ),
            Key(
                "max-stream-buffer-bytes",
                "8388608",
                _positive_int,
                "Bytes of jobs a streaming pull holds unwritten (its reader is slower) before "
                "it stops claiming more.",
            ),
            Key(
                "sweep-batch-size",
                "500",
                _positive_int,
                "Expired leases moved per sweep statement.",
            ),
            Key(
                "vacuum-interval-seconds",
                "1",
                _non_negative_int,
                "PostgreSQL: the sweeper looks this often (0: never; autovacuum alone) whether "
                "vacuum-min-dead-jobs row versions of the job table are dead, and vacuums it "
                "then, but a vacuum that took V seconds is followed by the next 8 sqrt(V) seconds "
                "after its start at the earliest. Claims step over the dead index entries until "
                "a vacuum.",
            ),
            Key(
                "vacuum-min-dead-jobs",
                "20000",
                _non_negative_int,
                "Dead row versions the job table needs before the sweeper vacuums it.",
            ),
        ),
    ),
    Section(
        "scheduler",
        (
            Key(
                "min-schedule-delay-minutes",
                "2",
                _non_negative_int,
                "How far ahead X-Broker-Scheduled-For must be (412 otherwise).",
            ),
            Key(
                "scheduler-interval-ms",
                "5000",
                _positive_int,
                "The Go original's polling interval; here a scheduled message's jobs are jobs "
                "not due yet, and waiting pulls and the dispatcher wake when they fall due.",
                implemented=False,
            ),
            Key(
                "scheduler-batch-size",
                "100",
                _positive_int,
                "The Go original's dispatch batch (no polling scheduler here).",
                implemented=False,
            ),
        ),
    ),
    Section(
        "gateway-auth",
        (
            Key(
                "mode",
                "none",
                _gateway_mode,
                "none, or hmac: every request but the exempt paths carries X-Broker-Signature.",
            ),
            Key(
                "hmac-shared-secret",
                "",
                _base64_secret,
                "The shared HMAC-SHA256 key, base64 (required with mode=hmac).",
                secret=True,
            ),
            Key(
                "hmac-timestamp-tolerance-seconds",
                "300",
                _positive_int,
                "How far a signature's timestamp may be from now.",
            ),
            Key(
                "auth-exempt-paths",
                "/_status,/metrics,/debug/pprof/",
                _path_prefixes,
                "Comma-separated path prefixes that need no signature.",
            ),
            Key(
                "require-v2",
                "false",
                _boolean,
                "Refuse v1 signatures (body only): a v2 one also covers method, path and query.",
            ),
            Key(
                "reject-replays",
                "false",
                _boolean,
                "Refuse a v2 signature already seen inside the timestamp tolerance (per process: "
                "route a client's requests to one process, or accept that a replay may reach "
                "another); implies require-v2.",
            ),
        ),
        "Gateway HMAC, as the Go original checks it (X-Broker-Signature: t=<unix>,v1=<hex>), "
        "plus v2.",
    ),
    Section(
        "nats",
        (
            Key("mode", "client", _nats_mode, "client or hybrid."),
            Key(
                "url",
                "nats://127.0.0.1:4222",
                _nats_url,
                "The NATS server the bridge connects to as a client (several separated by commas).",
            ),
            Key(
                "leaf-url",
                "",
                str,
                "mode=hybrid: the server's leafnode URL, e.g. nats-leaf://127.0.0.1:7422.",
            ),
            Key(
                "api-prefix",
                "$JS.API",
                _nats_prefix,
                "Subject prefix of the JetStream API requests the bridge answers.",
            ),
            Key(
                "ack-prefix",
                "$WB.ACK",
                _nats_prefix,
                "mode=client: subject prefix of the acks (a client may not use $JS.ACK).",
            ),
            Key(
                "queue-group",
                "webhook-broker-bridge",
                str,
                "Queue group shared by bridge processes, so each request is answered once.",
            ),
            Key("user", "", str, "Client connection user (empty: none)."),
            Key("password", "", str, "Client connection password."),
            Key("token", "", str, "Client connection auth token (empty: none)."),
            Key("credentials", "", str, "Client connection credentials file (empty: none)."),
            Key("leaf-user", "", str, "Leafnode connection user (empty: user)."),
            Key("leaf-password", "", str, "Leafnode connection password (empty: password)."),
            Key("leaf-token", "", str, "Leafnode connection auth token (empty: token)."),
            Key(
                "tls-ca-file",
                "",
                str,
                "CA certificates (PEM) the client and leafnode connections trust for tls:// "
                "URLs (empty: the system's).",
            ),
            Key(
                "tls-cert-file",
                "",
                str,
                "Client certificate (PEM) for TLS connections that require one (empty: none).",
            ),
            Key("tls-key-file", "", str, "Key of tls-cert-file (PEM)."),
        ),
        help="The NATS bridge (webhook-broker bridge). client: one client connection, acks under "
        "ack-prefix, works with any NATS server. hybrid: a client connection for $JS.API plus a "
        "leafnode connection (leaf-url) that delivers with $JS.ACK replies, so msg.metadata works.",
    ),
    Section(
        "pipeline",
        (
            Key(
                "archive-root",
                "webhook-broker-archive",
                _non_empty,
                "Where the Parquet archive goes: a local path, file:, hdfs: or s3a: URI.",
            ),
            Key(
                "report-root",
                "webhook-broker-report",
                _non_empty,
                "Where the report goes (a path the driver sees).",
            ),
            Key(
                "retention-days",
                "7",
                _non_negative_int,
                "Archive messages received more than this many days ago (database clock).",
            ),
            Key(
                "terminal-statuses",
                "DELIVERED,DEAD",
                _terminal_statuses,
                "A message is archived only when all its jobs are in these states.",
            ),
            Key("batch-size", "100000", _positive_int, "Messages per archive batch."),
            Key(
                "max-batches",
                "0",
                _non_negative_int,
                "New batches per run (0: until nothing is left).",
            ),
            Key(
                "jdbc-partitions",
                "4",
                _positive_int,
                "Most JDBC partitions per read; each one is a database connection.",
            ),
            Key("jdbc-fetch-size", "10000", _positive_int, "JDBC fetch size."),
            Key(
                "jdbc-jar",
                "/usr/share/java/postgresql.jar",
                _non_empty,
                "The PostgreSQL JDBC driver (spark.jars).",
            ),
            Key(
                "master",
                "",
                str,
                "Spark master; --master wins over it. Both empty: spark-submit's master, or "
                "local[*] when run directly.",
            ),
            Key("shuffle-partitions", "8", _positive_int, "spark.sql.shuffle.partitions."),
        ),
        help="The Spark archive and report jobs (webhook-broker pipeline); see docs/pipeline.md.",
    ),
)

SECTION_KEYS: dict[str, dict[str, Key]] = {
    section.name: {key.name: key for key in section.keys} for section in SECTIONS
}
# Defaults of the keys we act on. Not-implemented keys are left out: the template shows them
# commented out, so a copy of the template sets none of them and warns about nothing.
DEFAULTS: dict[str, dict[str, str]] = {
    section.name: {key.name: key.default for key in section.keys if key.implemented}
    for section in SECTIONS
}

SEED_SECTIONS = (
    "initial-channels",
    "initial-producers",
    "initial-consumers",
    "initial-channel-tokens",
    "initial-producer-tokens",
)
CONSUMER_SEED_KEYS = frozenset(
    {
        "token",
        "channel",
        "type",
        "name",
        "ack-wait",
        "max-ack-pending",
        "priority-groups",
        "priority-policy",
        "priority-timeout",
    }
)


def _export_destination(raw: str) -> str:
    if raw not in ("", "s3", "gcs"):
        raise ValueError("must be empty, s3 or gcs")
    return raw


# Sections of the Go original we do not implement, why, and their keys (parsed, so a bad value
# still stops the start). Set to any valid value they are reported like a not-implemented key;
# only [prune] message-retention-days can stop the start (see _check_go_retention).
IGNORED_SECTIONS: dict[str, tuple[str, dict[str, Callable[[str], object]]]] = {
    "prune": (
        # In Go only `webhook-broker -command prune` reads them, never the broker process.
        "pruning is `webhook-broker pipeline archive` here (Parquet archive, then delete; see "
        "[pipeline])",
        {
            "export-node-name": str,
            "message-retention-days": _non_negative_int,
            "remote-export-destination": _export_destination,
            "remote-export-url": str,
            "export-path": str,
            "remote-file-prefix": str,
            "max-archive-file-size-in-mb": _non_negative_int,
        },
    ),
    "dlq": (
        "no dead-letter summary table is kept here: dead jobs are counted where they are",
        {"summary-update-interval-seconds": _non_negative_int},
    ),
}


def _default(section: str, key: str) -> str:
    return SECTION_KEYS[section][key].default


# -- What the rest of the code gets ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    dialect: str
    connection_url: str
    pool_size: int
    max_overflow: int
    pool_recycle_seconds: int

    @property
    def sqlalchemy_url(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite+aiosqlite:///{self.connection_url}"
        rest = self.connection_url.split("://", 1)[1]
        return f"postgresql+psycopg://{rest}"


@dataclass(frozen=True, slots=True)
class HttpConfig:
    host: str
    port: int
    read_timeout: int
    write_timeout: int
    admin_token: str
    read_header_timeout: int = 10
    max_concurrency: int = 4096
    max_body_bytes: int = 1_048_576
    reader_token: str = ""
    allow_anonymous_admin: bool = False
    anonymous_reads: bool = False
    token_hash_key: str = ""

    @property
    def loopback(self) -> bool:
        """Whether the listener is reachable from this machine only."""
        return is_loopback_host(self.host)

    @property
    def guarded_reads(self) -> bool:
        """Whether reads (lists, messages, job counts) need a credential."""
        return bool(self.admin_token or self.reader_token) and not self.anonymous_reads

    def __repr__(self) -> str:
        return f"HttpConfig(host={self.host!r}, port={self.port}, tokens=<redacted>)"


def is_loopback_host(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class LogConfig:
    filename: str
    level: str
    format: str = "text"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    max_workers: int
    max_retry: int
    rational_delay_seconds: int
    retry_backoff_delays: tuple[int, ...]
    max_message_size_bytes: int

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_retry, self.retry_backoff_delays)


@dataclass(frozen=True, slots=True)
class ConsumerConnectionConfig:
    token_header_name: str
    user_agent: str
    connection_timeout_seconds: int


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    listener: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class PushConfig:
    max_in_flight: int = 100
    retry_after_max_seconds: int = 3600
    breaker_failures: int = 5
    breaker_cooldown_seconds: int = 30
    signing_secret_overlap_seconds: int = 86_400
    deny_callback_networks: tuple[str, ...] = DEFAULT_DENIED_CALLBACK_NETWORKS
    deny_private_callbacks: bool = False
    allow_callback_networks: tuple[str, ...] = ()
    max_response_bytes: int = 65_536


@dataclass(frozen=True, slots=True)
class PullConfig:
    max_batch: int
    max_stream_batch: int
    max_expires_seconds: int
    max_waiting: int
    sweep_batch_size: int
    # The sweeper looks this often (0: never) whether this many row versions of the job table
    # are dead, and vacuums it: claims walk the dead index entries their predecessors left
    # until a vacuum.
    vacuum_interval_seconds: int
    vacuum_min_dead_jobs: int
    max_waiting_total: int = 2048
    max_stream_buffer_bytes: int = 8_388_608


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """[pipeline]: the Spark archive and report jobs (docs/pipeline.md)."""

    archive_root: str
    report_root: str
    retention_days: int
    terminal_statuses: tuple[str, ...]
    batch_size: int
    max_batches: int  # 0: until nothing is left
    jdbc_partitions: int
    jdbc_fetch_size: int
    jdbc_jar: str
    master: str  # empty: spark-submit's master, else local[*]
    shuffle_partitions: int


@dataclass(frozen=True, slots=True)
class GatewayAuthConfig:
    mode: str = "none"
    hmac_shared_secret: bytes = b""
    hmac_timestamp_tolerance_seconds: int = 300
    auth_exempt_paths: tuple[str, ...] = ("/_status", "/metrics", "/debug/pprof/")
    require_v2: bool = False
    reject_replays: bool = False

    @property
    def enabled(self) -> bool:
        return self.mode == "hmac"

    def __repr__(self) -> str:
        return f"GatewayAuthConfig(mode={self.mode!r}, secret=<redacted>)"


@dataclass(frozen=True, slots=True)
class NatsConfig:
    """mode=client: one client connection, acks under ack-prefix (any NATS server).
    mode=hybrid: the client connection answers the API; a leafnode connection to leaf-url
    delivers with `$JS.ACK.` replies (msg.metadata works) and receives the acks."""

    # Defaults here too (from the table) because tests and tools build one from a few fields.
    mode: str = _default("nats", "mode")
    url: str = _default("nats", "url")
    # A [nats] section was given (file or environment): API processes and sweepers then
    # publish their advisories (pins, lapsed leases) to `url` too.
    configured: bool = False
    leaf_url: str = _default("nats", "leaf-url")
    api_prefix: str = _default("nats", "api-prefix")
    ack_prefix: str = _default("nats", "ack-prefix")
    queue_group: str = _default("nats", "queue-group")
    user: str = _default("nats", "user")
    password: str = _default("nats", "password")
    token: str = _default("nats", "token")
    credentials: str = _default("nats", "credentials")
    leaf_user: str = _default("nats", "leaf-user")
    leaf_password: str = _default("nats", "leaf-password")
    leaf_token: str = _default("nats", "leaf-token")
    tls_ca_file: str = _default("nats", "tls-ca-file")
    tls_cert_file: str = _default("nats", "tls-cert-file")
    tls_key_file: str = _default("nats", "tls-key-file")


@dataclass(frozen=True, slots=True)
class SeedConsumer:
    id: str
    channel_id: str
    name: str
    token: str
    callback_url: str
    type: ConsumerType
    ack_wait_seconds: int | None
    max_ack_pending: int | None
    priority: PrioritySettings = NO_PRIORITY


@dataclass(frozen=True, slots=True)
class SeedStakeholder:
    id: str
    name: str
    token: str


@dataclass(frozen=True, slots=True)
class SeedData:
    channels: tuple[SeedStakeholder, ...] = ()
    producers: tuple[SeedStakeholder, ...] = ()
    consumers: tuple[SeedConsumer, ...] = ()
    # Why each seeded consumer that is not created was left out (the pull consumer spec: an
    # invalid type= skips that consumer only); the seeding logs each as an error.
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Config:
    database: DatabaseConfig
    http: HttpConfig
    log: LogConfig
    broker: BrokerConfig
    consumer_connection: ConsumerConnectionConfig
    pull: PullConfig
    pipeline: PipelineConfig
    push: PushConfig = field(default_factory=PushConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    nats: NatsConfig = field(default_factory=lambda: NatsConfig())
    gateway_auth: GatewayAuthConfig = field(default_factory=GatewayAuthConfig)
    min_schedule_delay_minutes: int = 2
    seed: SeedData = field(default_factory=SeedData)
    sources: tuple[str, ...] = ()
    # "[section] key" of every key that was set but has no effect here (not implemented, or in
    # an ignored section of the Go original); the process entry point logs them as unused.
    ignored_keys: tuple[str, ...] = ()

    @property
    def default_ack_wait_seconds(self) -> int:
        """The seed spec's job timeout: stopTimeout (connection timeout) + rationalDelay."""
        return (
            self.consumer_connection.connection_timeout_seconds + self.broker.rational_delay_seconds
        )


# -- Loading --------------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    search_default_locations: bool = True,
) -> Config:
    """Merge every layer and validate the result; raises ConfigError naming the bad key."""
    parser = _new_parser()
    sources: list[str] = []
    candidates: list[Path] = list(default_locations()) if search_default_locations else []
    if path is not None:
        explicit = Path(path)
        if not explicit.is_file():
            raise ConfigError(f"config file {explicit} does not exist")
        candidates.append(explicit)
    for candidate in candidates:
        if candidate.is_file():
            try:
                parser.read(candidate, encoding="utf-8")
            except (configparser.Error, UnicodeDecodeError) as exc:
                raise ConfigError(f"{candidate}: {exc}") from exc
            sources.append(str(candidate))
    _apply_environment(parser, os.environ if environ is None else environ)
    return dataclasses.replace(_build(parser), sources=tuple(sources))


def load_config_text(text: str, *, environ: Mapping[str, str] | None = None) -> Config:
    """Defaults plus one INI text (and the environment, if given); for tests and tools."""
    parser = _new_parser()
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise ConfigError(str(exc)) from exc
    _apply_environment(parser, environ or {})
    return _build(parser)


def _new_parser() -> configparser.ConfigParser:
    # Ids and tokens are case-sensitive and may hold '%': no lower-casing, no interpolation.
    # The parser holds only what files and the environment set (defaults come from the table),
    # so a key present in it was set, which is what the not-implemented warning needs.
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    return parser


def _apply_environment(parser: configparser.ConfigParser, environ: Mapping[str, str]) -> None:
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].split("__")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"environment variable {name}: expected {ENV_PREFIX}<SECTION>__<KEY>")
        section = parts[0].lower().replace("_", "-")
        # Seeded ids are case-sensitive and may hold underscores: keep them as written.
        key = parts[1] if section in SEED_SECTIONS else parts[1].lower().replace("_", "-")
        if not parser.has_section(section):
            parser.add_section(section)
        parser.set(section, key, value)


def _check_known_keys(parser: configparser.ConfigParser) -> None:
    seeded_consumers = (
        set(parser["initial-consumers"]) if parser.has_section("initial-consumers") else set()
    )
    for section in parser.sections():
        if section in SECTION_KEYS:
            unknown = set(parser[section]) - set(SECTION_KEYS[section])
            if unknown:
                key = sorted(unknown)[0]
                raise ConfigError(f"[{section}] {key}: unknown key")
        elif not (
            section in SEED_SECTIONS or section in IGNORED_SECTIONS or section in seeded_consumers
        ):
            # A misspelt section ([brokr]) would otherwise be ignored without a word.
            raise ConfigError(
                f"[{section}]: unknown section (not a known section, nor a consumer named in "
                "[initial-consumers])"
            )


def _ignored_keys(parser: configparser.ConfigParser) -> tuple[str, ...]:
    """The Go original's keys that were set but have no meaning here (the broker logs them as
    unused). Any valid value is accepted: a Go production config must start. A bad value still
    stops the start (not-implemented keys are parsed with the rest of their section)."""
    found: list[str] = []
    for section in parser.sections():
        keys = SECTION_KEYS.get(section)
        for name in parser[section]:
            if section in IGNORED_SECTIONS:
                parsers = IGNORED_SECTIONS[section][1]
                if name not in parsers:
                    raise ConfigError(f"[{section}] {name}: unknown key")
                raw = parser[section][name].strip()
                try:
                    parsers[name](raw)
                except ValueError as exc:
                    raise ConfigError(f"[{section}] {name}={raw!r}: {exc}") from None
            elif keys is None or keys[name].implemented:
                continue
            found.append(f"[{section}] {name}")
    _check_go_retention(parser)
    return tuple(found)


def _check_go_retention(parser: configparser.ConfigParser) -> None:
    """The one Go key whose value would change what happens here: a Go config that prunes
    (export-node-name and message-retention-days both set, Go's IsPruningEnabled) keeps
    messages that many days; `webhook-broker pipeline archive` deletes after [pipeline]
    retention-days instead, so a different number would archive and delete data earlier (or
    later) than the operator configured."""
    if not parser.has_section("prune"):
        return
    prune = parser["prune"]
    days = _non_negative_int(prune.get("message-retention-days", "0").strip())
    if days == 0 or not prune.get("export-node-name", "").strip():
        return
    raw = parser.get("pipeline", "retention-days", fallback=_default("pipeline", "retention-days"))
    ours = _non_negative_int(raw.strip())
    if ours != days:
        raise ConfigError(
            f"[prune] message-retention-days={days}: pruning here is `webhook-broker pipeline "
            f"archive`, which deletes after [pipeline] retention-days={ours}; set [pipeline] "
            f"retention-days={days} to keep the Go retention (or remove the [prune] key)"
        )


def _parse(parser: configparser.ConfigParser, section: str, key: Key) -> Any:
    raw = parser.get(section, key.name, fallback=key.default).strip()
    try:
        return key.parse(raw)
    except (ValueError, TypeError) as exc:
        shown = "" if key.secret else f"={raw!r}"
        raise ConfigError(f"[{section}] {key.name}{shown}: {exc}") from None


def _parse_section(parser: configparser.ConfigParser, section: Section) -> dict[str, Any]:
    """Every key of the section, set or defaulted, parsed and keyed by field name."""
    return {key.field_name: _parse(parser, section.name, key) for key in section.keys}


D = TypeVar("D", bound="DataclassInstance")


def _fill(cls: type[D], values: Mapping[str, Any]) -> D:
    """A section's dataclass from its parsed values, by field name. Values it has no field for
    (not-implemented keys, or keys a builder folded into other fields) are left out."""
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


def _build(parser: configparser.ConfigParser) -> Config:
    _check_known_keys(parser)
    values = {section.name: _parse_section(parser, section) for section in SECTIONS}
    return Config(
        database=_database(values["rdbms"]),
        http=_http(values["http"]),
        log=_fill(LogConfig, values["log"]),
        broker=_fill(BrokerConfig, values["broker"]),
        consumer_connection=_fill(ConsumerConnectionConfig, values["consumer-connection"]),
        pull=_fill(PullConfig, values["pull"]),
        push=_fill(PushConfig, values["push"]),
        metrics=_fill(MetricsConfig, values["metrics"]),
        pipeline=_fill(PipelineConfig, values["pipeline"]),
        nats=dataclasses.replace(_nats(values["nats"]), configured=parser.has_section("nats")),
        gateway_auth=_gateway_auth(values["gateway-auth"]),
        min_schedule_delay_minutes=values["scheduler"]["min_schedule_delay_minutes"],
        seed=_build_seed(parser),
        ignored_keys=_ignored_keys(parser),
    )


def _database(values: Mapping[str, Any]) -> DatabaseConfig:
    dialect: str = values["dialect"]
    url: str = values["connection_url"]
    if dialect == "postgresql" and not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"[rdbms] connection-url: a PostgreSQL URL looks like "
            f"postgresql://user:password@host:port/dbname, got {_redact_url(url)!r}"
        )
    if dialect == "sqlite" and "://" in url:
        raise ConfigError("[rdbms] connection-url: for sqlite give a file path, not a URL")
    if dialect == "sqlite":
        url = url.split("?", 1)[0]
    # The Go original's idle/open pair, as SQLAlchemy's pool size plus overflow.
    idle: int = values["max_idle_connxns"]
    most: int = values["max_open_connxns"]
    return _fill(
        DatabaseConfig,
        {
            **values,
            "connection_url": url,
            "pool_size": min(idle, most),
            "max_overflow": max(0, most - idle),
        },
    )


def _http(values: Mapping[str, Any]) -> HttpConfig:
    host, port = values["listener"]
    config = _fill(HttpConfig, {**values, "host": host, "port": port})
    if not config.loopback and not config.admin_token and not config.allow_anonymous_admin:
        raise ConfigError(
            f"[http] admin-token: the listener {host}:{port} is not loopback, so changes need "
            "an admin token; set [http] admin-token (or [http] allow-anonymous-admin=true to "
            "run open, or listen on 127.0.0.1)"
        )
    if config.reader_token and config.reader_token == config.admin_token:
        raise ConfigError("[http] reader-token: must differ from admin-token")
    return config


def _gateway_auth(values: Mapping[str, Any]) -> GatewayAuthConfig:
    config = _fill(GatewayAuthConfig, values)
    if config.enabled and not config.hmac_shared_secret:
        raise ConfigError("[gateway-auth] hmac-shared-secret: required when mode=hmac")
    return config


def _nats(values: Mapping[str, Any]) -> NatsConfig:
    config = _fill(NatsConfig, values)
    if config.mode == "hybrid":
        if not config.leaf_url:
            raise ConfigError("[nats] leaf-url: mode=hybrid needs the server's leafnode URL")
        try:
            _nats_url(config.leaf_url)
        except ValueError as exc:
            raise ConfigError(f"[nats] leaf-url={config.leaf_url!r}: {exc}") from None
    if config.mode == "client" and (config.ack_prefix + ".").startswith("$JS.ACK."):
        raise ConfigError(
            f"[nats] ack-prefix={config.ack_prefix!r}: a client connection may not publish with a "
            "$JS.ACK reply (the server refuses it); use mode=hybrid or another prefix"
        )
    return config


def _redact_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


# -- Seeds: [initial-*] sections and one section per seeded consumer ------------------------------


def _section(parser: configparser.ConfigParser, name: str) -> Sequence[tuple[str, str]]:
    if not parser.has_section(name):
        return ()
    return [(key, value.strip()) for key, value in parser.items(name)]


def _build_seed(parser: configparser.ConfigParser) -> SeedData:
    channel_tokens = dict(_section(parser, "initial-channel-tokens"))
    producer_tokens = dict(_section(parser, "initial-producer-tokens"))
    channels = tuple(
        _seed_stakeholder("initial-channels", key, name, channel_tokens)
        for key, name in _section(parser, "initial-channels")
    )
    producers = tuple(
        _seed_stakeholder("initial-producers", key, name, producer_tokens)
        for key, name in _section(parser, "initial-producers")
    )
    for section, tokens, seeded in (
        ("initial-channel-tokens", channel_tokens, channels),
        ("initial-producer-tokens", producer_tokens, producers),
    ):
        known = {item.id for item in seeded}
        for key in tokens:
            if key not in known:
                raise ConfigError(f"[{section}] {key}: no such seeded id in its initial-* section")
    consumers: list[SeedConsumer] = []
    skipped: list[str] = []
    for key, url in _section(parser, "initial-consumers"):
        try:
            consumers.append(_seed_consumer(parser, key, url))
        except _SkippedConsumer as exc:
            skipped.append(str(exc))
    return SeedData(
        channels=channels,
        producers=producers,
        consumers=tuple(consumers),
        skipped=tuple(skipped),
    )


class _SkippedConsumer(Exception):
    """A seeded consumer the spec says is not created, while the rest of the start goes on."""


# Ids, names and tokens are stored in VARCHAR(255) columns.
MAX_SEED_FIELD_LENGTH = 255


def _check_lengths(where: str, **fields: str) -> None:
    for field_name, value in fields.items():
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            raise ConfigError(f"{where}: the {field_name} must not contain control characters")
        if len(value) > MAX_SEED_FIELD_LENGTH:
            raise ConfigError(
                f"{where}: the {field_name} must be at most {MAX_SEED_FIELD_LENGTH} characters"
            )


def _seed_stakeholder(
    section: str, key: str, name: str, tokens: Mapping[str, str]
) -> SeedStakeholder:
    token = tokens.get(key, "")
    if not token:
        token_section = section.rstrip("s") + "-tokens"
        raise ConfigError(f"[{section}] {key}: needs a token in [{token_section}]")
    _check_lengths(f"[{section}] {key[:40]}", id=key, name=name, token=token)
    return SeedStakeholder(id=key, name=name or key, token=token)


def _seed_consumer(parser: configparser.ConfigParser, key: str, url: str) -> SeedConsumer:
    where = f"[initial-consumers] {key}"
    if not parser.has_section(key):
        raise ConfigError(f"{where}: needs a section [{key}] with token and channel")
    options = dict(_section(parser, key))
    unknown = set(options) - CONSUMER_SEED_KEYS
    if unknown:
        raise ConfigError(f"[{key}] {sorted(unknown)[0]}: unknown key")
    raw_type = options.get("type", "").lower()
    try:
        consumer_type = ConsumerType(raw_type) if raw_type else ConsumerType.PUSH
    except ValueError:
        raise _SkippedConsumer(
            f"[{key}] type={raw_type!r}: must be push or pull; consumer {key!r} is not created"
        ) from None
    if not options.get("token"):
        raise ConfigError(f"[{key}] token: must not be empty")
    if not options.get("channel"):
        raise ConfigError(f"[{key}] channel: must name a channel")
    _check_lengths(
        f"[initial-consumers] {key[:40]}",
        id=key,
        name=options.get("name", ""),
        token=options["token"],
    )
    if url:
        try:
            parse_callback_url(url)
        except InvalidInput as exc:
            raise ConfigError(f"{where}={url!r}: {exc.detail}") from None
    if consumer_type is ConsumerType.PUSH and not url:
        raise ConfigError(f"{where}: a push consumer needs an absolute callback URL")

    def optional_int(option: str, convert: Callable[[str], int]) -> int | None:
        raw = options.get(option, "")
        if not raw:
            return None
        try:
            return convert(raw)
        except ValueError as exc:
            raise ConfigError(f"[{key}] {option}={raw!r}: {exc}") from None

    raw_groups = options.get("priority-groups", "")
    try:
        priority = priority_settings(
            [g.strip() for g in raw_groups.split(",")] if raw_groups.strip() else [],
            parse_policy(options.get("priority-policy")),
            optional_int("priority-timeout", _positive_int),
            pull=consumer_type is ConsumerType.PULL,
        )
    except InvalidInput as exc:
        raise ConfigError(f"[{key}] priority-*: {exc.detail}") from None
    return SeedConsumer(
        id=key,
        channel_id=options["channel"],
        name=options.get("name") or key,
        token=options["token"],
        callback_url=url,
        type=consumer_type,
        ack_wait_seconds=optional_int("ack-wait", _positive_int),
        max_ack_pending=optional_int("max-ack-pending", _positive_int),
        priority=priority,
    )


# -- webhook-broker.cfg.template, generated from SECTIONS -----------------------------------------

TEMPLATE_HEADER = """\
# webhook-broker configuration. Every key is shown with its built-in default.
#
# Files are read in this order, later ones overriding earlier ones key by key:
#   /etc/webhook-broker/webhook-broker.cfg, ~/.webhook-broker/webhook-broker.cfg,
#   ./webhook-broker.cfg, then the file given with --config.
# Then environment variables override single keys, for containers:
#   WEBHOOK_BROKER__<SECTION>__<KEY>, underscores standing for dashes, e.g.
#   WEBHOOK_BROKER__RDBMS__CONNECTION_URL=postgresql://broker:secret@db:5432/broker
# A bad value stops the broker at start with the section, key and reason.
# Keys shown commented out are the Go original's that have no effect here: set to any valid
# value they are accepted, and the start logs them as unused. The one exception: a Go [prune]
# message-retention-days that prunes must agree with [pipeline] retention-days.
# Generated from app/config.py: python -m app.config > webhook-broker.cfg.template
"""

NOT_IMPLEMENTED_NOTE = "Unused here: any valid value is accepted and logged as unused."

TEMPLATE_FOOTER = """\
# Seeds, applied on every start (created or updated, never deleted). Uncomment to use.
# [initial-channels]
# sample-channel=Sample Channel
# [initial-producers]
# sample-producer=Sample Producer
# [initial-channel-tokens]
# sample-channel=sample-channel-token
# [initial-producer-tokens]
# sample-producer=sample-producer-token
# [initial-consumers]
# id=callback URL (may be empty for a pull consumer)
# sample-consumer=http://sample-endpoint/webhook-receiver
# sample-puller=
# One section per seeded consumer: token and channel are required; type is push
# (default) or pull; ack-wait (seconds), max-ack-pending and name are optional, and so are a
# pull consumer's priority-groups (one group), priority-policy (overflow, pinned_client,
# prioritized) and priority-timeout (seconds, pinned_client).
# [sample-consumer]
# token=sample-consumer-token
# channel=sample-channel
# [sample-puller]
# token=sample-puller-token
# channel=sample-channel
# type=pull
"""


def _comment(text: str) -> list[str]:
    wrapped = textwrap.wrap(text, width=98, break_long_words=False, break_on_hyphens=False)
    return [f"# {line}" for line in wrapped]


def render_template() -> str:
    """The commented config template; tests check the committed file equals it."""
    lines = [TEMPLATE_HEADER]
    for section in SECTIONS:
        lines.append(f"[{section.name}]")
        if section.help:
            # A bare "#" line keeps the section's prose apart from its first key's help.
            lines += [*_comment(section.help), "#"]
        for key in section.keys:
            if key.implemented:
                lines += [*_comment(key.help), f"{key.name}={key.default}"]
            else:
                lines += [*_comment(f"{key.help} {NOT_IMPLEMENTED_NOTE}")]
                lines.append(f"# {key.name}={key.default}")
        lines.append("")
    for name, (why, _defaults) in sorted(IGNORED_SECTIONS.items()):
        lines += _comment(
            f"The Go original's [{name}] section: its keys are accepted and logged as unused; "
            f"{why}."
        )
    lines += ["", TEMPLATE_FOOTER]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_template(), end="")
