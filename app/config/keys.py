"""The key table: every key of webhook-broker.cfg, once, with its default, parser and help.

The defaults (here and on the dataclasses of app.config.model), the validation, the unknown-key
check, the template and the docs' configuration page all come from SECTIONS.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from app.domain.jobs import JobStatus


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


def _postgres_url(raw: str) -> str:
    """Empty (none), or a PostgreSQL URL."""
    if raw and not raw.startswith(("postgresql://", "postgres://")):
        raise ValueError("must be postgresql://user:password@host:port/dbname (or empty)")
    return raw


def _niceness(raw: str) -> int:
    value = _integer(raw)
    if not 0 <= value <= 19:
        raise ValueError("must be between 0 and 19")
    return value


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(raw: str) -> float:
    """Seconds, from '5s', '250ms', '1.5s', '2m', '1h' or a bare number of seconds."""
    text = raw.strip().lower()
    number, scale = text, 1.0
    for unit in ("ms", "s", "m", "h"):  # "ms" before "s" and "m"
        if text.endswith(unit):
            number, scale = text[: -len(unit)].strip(), _DURATION_UNITS[unit]
            break
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError("must be a duration such as 5s, 250ms or 2m") from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive duration")
    return value


def _partition_interval(raw: str) -> float:
    """Seconds from '1d', '12h', '30m' (or any duration _duration reads); 0 or 'off': none."""
    text = raw.strip().lower()
    if text in ("0", "off"):
        return 0.0
    if text.endswith("d"):
        try:
            days = float(text[:-1].strip())
        except ValueError:
            raise ValueError("must be a duration such as 1d, 12h or 30m, or off") from None
        if not days > 0 or days == float("inf"):
            raise ValueError("must be a positive duration, or off")
        return days * 86400.0
    return _duration(text)


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
                "Seconds a pooled connection may sit unused before it is closed and replaced at "
                "its next use (0 = no limit). Unused for a minute or more, a connection is "
                "checked with a round trip before it is handed out, whatever this says.",
                attr="pool_max_idle_seconds",
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
            Key(
                "replica-url",
                "",
                _postgres_url,
                "A streaming replica (hot standby) of the PostgreSQL database, as a "
                "postgresql:// URL: status, lists, message reads, the console and the "
                "pipeline's report read from it while it is within replica-max-lag (the "
                "response header X-Broker-Read-From, the report's read_from, says which "
                "answered); the archive's exports read it once it has replayed past the "
                "primary ([pipeline] replica-wait). Empty, or with sqlite: everything reads "
                "the primary.",
                secret=True,  # it may hold a password
            ),
            Key(
                "replica-max-lag",
                "5s",
                _duration,
                "How far behind the primary the replica may be for reads to go to it (5s, "
                "250ms, 1m); beyond it, or while it is unreachable, they go to the primary.",
                attr="replica_max_lag_seconds",
            ),
            Key(
                "partition-interval",
                "1d",
                _partition_interval,
                "PostgreSQL: the job table's partitions each take the ids issued in this long "
                "(1d, 12h, 30m), made ahead by the sweeper; a partition whose jobs are all "
                "delivered is archived and dropped whole once [pipeline] retention-days have "
                "passed since it closed (docs/operations/storage.md). off: no rotation (the "
                "archive deletes rows).",
                attr="partition_interval_seconds",
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
                "vacuum-min-dead-jobs row versions of the job table are dead, and vacuums then "
                "the partitions that hold some, in one process; but a vacuum that took V seconds "
                "is followed by the next 8 sqrt(V) seconds after its start at the earliest. "
                "Claims step over the dead index entries until a vacuum.",
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
            Key(
                "allow-consumer-management",
                "true",
                _boolean,
                "Whether JetStream clients may create, update and delete pull consumers over "
                "NATS (CONSUMER.CREATE / DURABLE.CREATE / DELETE); false: they bind to existing "
                "consumers only. NATS permissions on those subjects decide who may.",
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
            Key(
                "niceness",
                "0",
                _niceness,
                "The pipeline process's nice value (0..19), set at its start; the Spark JVM, "
                "its child, inherits it. 19: the archive takes only CPU the broker leaves "
                "idle (docs/operations/storage.md).",
            ),
            Key(
                "replica-wait",
                "60s",
                _duration,
                "With [rdbms] replica-url: how long the archive waits for the replica to "
                "replay past the primary's position before reading a batch or partition from "
                "it (30s, 2m); beyond it, or with the replica down, it reads the primary.",
                attr="replica_wait_seconds",
            ),
        ),
        help="The Spark archive and report jobs (webhook-broker pipeline); see docs/pipeline.md.",
    ),
    Section(
        "ui",
        (
            Key(
                "enabled",
                "true",
                _boolean,
                "Serve the operator console at /ui on the API's listener. It starts only on a "
                "loopback listener or with an admin-token or reader-token set (sign-in takes "
                "one of them); false turns it off.",
            ),
            Key(
                "attempts-kept",
                "10",
                _positive_int,
                "Attempts of each job kept in its history (time, outcome, HTTP status, "
                "duration, error), shown on the console's job page; the oldest go first.",
            ),
        ),
        help="The operator console (docs/console.md).",
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


def raw_default(section: str, key: str) -> str:
    """The table's default of a key as written in a file."""
    return SECTION_KEYS[section][key].default


def default(section: str, key: str) -> Any:
    """The table's default of a key, parsed: what a dataclass field defaults to, so that a
    default is written once (in the table) whether the field is loaded or built by hand."""
    found = SECTION_KEYS[section][key]
    return found.parse(found.default)
