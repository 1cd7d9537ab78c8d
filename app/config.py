"""Read webhook-broker.cfg (INI) into one frozen, validated Config.

Layers, later ones win key by key: built-in defaults, /etc/webhook-broker/webhook-broker.cfg,
~/.webhook-broker/webhook-broker.cfg, ./webhook-broker.cfg, --config PATH, then environment
variables WEBHOOK_BROKER__<SECTION>__<KEY> (underscores in SECTION and KEY stand for dashes,
except that a KEY of an [initial-*] section is an id and is taken as written).
Nothing is read at import time: entry points call load_config() and pass the result down.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

from app.domain.jobs import JobStatus, RetryPolicy
from app.domain.models import ConsumerType

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


# Every key we read, with its default; the template documents the same keys.
DEFAULTS: dict[str, dict[str, str]] = {
    "rdbms": {
        "dialect": "sqlite",
        "connection-url": "webhook-broker.sqlite3",
        "connxn-max-idle-time-seconds": "0",
        "connxn-max-lifetime-seconds": "0",
        "max-idle-connxns": "10",
        "max-open-connxns": "20",
    },
    "http": {
        "listener": ":8080",
        "read-timeout": "240",
        "write-timeout": "240",
        "admin-token": "",
    },
    "log": {
        "filename": "",
        "log-level": "info",
        "max-file-size-in-mb": "200",
        "max-backups": "3",
        "max-age-in-days": "28",
        "compress-backups": "true",
    },
    "broker": {
        "max-message-queue-size": "10000",
        "max-workers": "200",
        "priority-dispatcher-enabled": "true",
        "retrigger-base-endpoint": "http://localhost:8080",
        "max-retry": "5",
        "rational-delay-in-seconds": "2",
        "retry-backoff-delays-in-seconds": "5,30,60",
        "recovery-workers-enabled": "true",
        "max-message-size-bytes": "5242880",
    },
    "consumer-connection": {
        "token-header-name": "X-Broker-Consumer-Token",
        "user-agent": "Webhook Message Broker",
        "connection-timeout-in-seconds": "30",
    },
    "pull": {
        "max-batch": "256",
        "max-expires-seconds": "300",
        "max-waiting": "512",
        "sweep-batch-size": "500",
        "vacuum-interval-seconds": "10",
        "vacuum-min-dead-jobs": "20000",
    },
    "nats": {
        "mode": "client",
        "url": "nats://127.0.0.1:4222",
        "leaf-url": "",
        "api-prefix": "$JS.API",
        "ack-prefix": "$WB.ACK",
        "queue-group": "webhook-broker-bridge",
        "user": "",
        "password": "",
        "token": "",
        "credentials": "",
        "leaf-user": "",
        "leaf-password": "",
        "leaf-token": "",
    },
    "pipeline": {
        "archive-root": "webhook-broker-archive",
        "report-root": "webhook-broker-report",
        "retention-days": "7",
        "terminal-statuses": "DELIVERED,DEAD",
        "batch-size": "100000",
        "max-batches": "0",
        "jdbc-partitions": "4",
        "jdbc-fetch-size": "10000",
        "jdbc-jar": "/usr/share/java/postgresql.jar",
        "master": "",
        "shuffle-partitions": "8",
    },
}

SEED_SECTIONS = (
    "initial-channels",
    "initial-producers",
    "initial-consumers",
    "initial-channel-tokens",
    "initial-producer-tokens",
)
CONSUMER_SEED_KEYS = frozenset({"token", "channel", "type", "name", "ack-wait", "max-ack-pending"})
# Sections of the Go original we accept in a config file but do not use.
IGNORED_SECTIONS = frozenset({"scheduler", "prune", "dlq", "gateway-auth"})


class ConfigError(ValueError):
    """A config value is invalid; the message names the section, key and reason."""


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


@dataclass(frozen=True, slots=True)
class LogConfig:
    filename: str
    level: str


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
class PullConfig:
    max_batch: int
    max_expires_seconds: int
    max_waiting: int
    sweep_batch_size: int
    # The sweeper vacuums the job table this often (0: never), once this many row versions
    # are dead: claims walk the dead index entries their predecessors left until a vacuum.
    vacuum_interval_seconds: int
    vacuum_min_dead_jobs: int


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
class SeedConsumer:
    id: str
    channel_id: str
    name: str
    token: str
    callback_url: str
    type: ConsumerType
    ack_wait_seconds: int | None
    max_ack_pending: int | None


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


@dataclass(frozen=True, slots=True)
class Config:
    database: DatabaseConfig
    http: HttpConfig
    log: LogConfig
    broker: BrokerConfig
    consumer_connection: ConsumerConnectionConfig
    pull: PullConfig
    pipeline: PipelineConfig
    nats: NatsConfig = field(default_factory=lambda: NatsConfig())
    seed: SeedData = field(default_factory=SeedData)
    sources: tuple[str, ...] = ()

    @property
    def default_ack_wait_seconds(self) -> int:
        """The seed spec's job timeout: stopTimeout (connection timeout) + rationalDelay."""
        return (
            self.consumer_connection.connection_timeout_seconds + self.broker.rational_delay_seconds
        )


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    search_default_locations: bool = True,
) -> Config:
    """Merge every layer and validate the result; raises ConfigError naming the bad key."""
    parser = _new_parser()
    parser.read_dict(DEFAULTS)
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
    parser.read_dict(DEFAULTS)
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        raise ConfigError(str(exc)) from exc
    _apply_environment(parser, environ or {})
    return _build(parser)


def _new_parser() -> configparser.ConfigParser:
    # Ids and tokens are case-sensitive and may hold '%': no lower-casing, no interpolation.
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


T = TypeVar("T")


def _get(
    parser: configparser.ConfigParser, section: str, key: str, convert: Callable[[str], T]
) -> T:
    raw = parser.get(section, key, fallback=DEFAULTS[section][key]).strip()
    try:
        return convert(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"[{section}] {key}={raw!r}: {exc}") from None


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


def _log_level(raw: str) -> str:
    level = raw.upper()
    aliases = {"WARN": "WARNING", "FATAL": "CRITICAL", "PANIC": "CRITICAL", "TRACE": "DEBUG"}
    level = aliases.get(level, level)
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("must be one of debug, info, warn, error, fatal")
    return level


def _check_known_keys(parser: configparser.ConfigParser) -> None:
    seeded_consumers = (
        set(parser["initial-consumers"]) if parser.has_section("initial-consumers") else set()
    )
    for section in parser.sections():
        if section in DEFAULTS:
            unknown = set(parser[section]) - set(DEFAULTS[section])
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


def _build(parser: configparser.ConfigParser) -> Config:
    _check_known_keys(parser)
    dialect = _get(parser, "rdbms", "dialect", _dialect)
    url = _get(parser, "rdbms", "connection-url", str)
    if not url:
        raise ConfigError("[rdbms] connection-url: must not be empty")
    if dialect == "postgresql" and not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"[rdbms] connection-url: a PostgreSQL URL looks like "
            f"postgresql://user:password@host:port/dbname, got {_redact_url(url)!r}"
        )
    if dialect == "sqlite" and "://" in url:
        raise ConfigError("[rdbms] connection-url: for sqlite give a file path, not a URL")
    if dialect == "sqlite":
        url = url.split("?", 1)[0]
    pool_size = _get(parser, "rdbms", "max-idle-connxns", _positive_int)
    max_open = _get(parser, "rdbms", "max-open-connxns", _positive_int)
    database = DatabaseConfig(
        dialect=dialect,
        connection_url=url,
        pool_size=min(pool_size, max_open),
        max_overflow=max(0, max_open - pool_size),
        pool_recycle_seconds=_get(
            parser, "rdbms", "connxn-max-lifetime-seconds", _non_negative_int
        ),
    )
    _get(parser, "rdbms", "connxn-max-idle-time-seconds", _non_negative_int)
    host, port = _get(parser, "http", "listener", _listener)
    http = HttpConfig(
        host=host,
        port=port,
        read_timeout=_get(parser, "http", "read-timeout", _positive_int),
        write_timeout=_get(parser, "http", "write-timeout", _positive_int),
        admin_token=_get(parser, "http", "admin-token", str),
    )
    log = LogConfig(
        filename=_get(parser, "log", "filename", str),
        level=_get(parser, "log", "log-level", _log_level),
    )
    for key in ("max-file-size-in-mb", "max-backups", "max-age-in-days"):
        _get(parser, "log", key, _non_negative_int)
    _get(parser, "log", "compress-backups", _boolean)
    broker = BrokerConfig(
        max_workers=_get(parser, "broker", "max-workers", _positive_int),
        max_retry=_get(parser, "broker", "max-retry", _non_negative_int),
        rational_delay_seconds=_get(parser, "broker", "rational-delay-in-seconds", _positive_int),
        retry_backoff_delays=_get(parser, "broker", "retry-backoff-delays-in-seconds", _delays),
        max_message_size_bytes=_get(parser, "broker", "max-message-size-bytes", _positive_int),
    )
    _get(parser, "broker", "max-message-queue-size", _positive_int)
    _get(parser, "broker", "priority-dispatcher-enabled", _boolean)
    _get(parser, "broker", "recovery-workers-enabled", _boolean)
    connection = ConsumerConnectionConfig(
        token_header_name=_get(parser, "consumer-connection", "token-header-name", _header_name),
        user_agent=_get(parser, "consumer-connection", "user-agent", str),
        connection_timeout_seconds=_get(
            parser, "consumer-connection", "connection-timeout-in-seconds", _positive_int
        ),
    )
    pull = PullConfig(
        max_batch=_get(parser, "pull", "max-batch", _positive_int),
        max_expires_seconds=_get(parser, "pull", "max-expires-seconds", _positive_int),
        max_waiting=_get(parser, "pull", "max-waiting", _positive_int),
        sweep_batch_size=_get(parser, "pull", "sweep-batch-size", _positive_int),
        vacuum_interval_seconds=_get(parser, "pull", "vacuum-interval-seconds", _non_negative_int),
        vacuum_min_dead_jobs=_get(parser, "pull", "vacuum-min-dead-jobs", _non_negative_int),
    )
    return Config(
        database=database,
        http=http,
        log=log,
        broker=broker,
        consumer_connection=connection,
        pull=pull,
        pipeline=_build_pipeline(parser),
        nats=_build_nats(parser),
        seed=_build_seed(parser),
    )


def _build_pipeline(parser: configparser.ConfigParser) -> PipelineConfig:
    def get(key: str, convert: Callable[[str], T]) -> T:
        return _get(parser, "pipeline", key, convert)

    return PipelineConfig(
        archive_root=get("archive-root", _non_empty),
        report_root=get("report-root", _non_empty),
        retention_days=get("retention-days", _non_negative_int),
        terminal_statuses=get("terminal-statuses", _terminal_statuses),
        batch_size=get("batch-size", _positive_int),
        max_batches=get("max-batches", _non_negative_int),
        jdbc_partitions=get("jdbc-partitions", _positive_int),
        jdbc_fetch_size=get("jdbc-fetch-size", _positive_int),
        jdbc_jar=get("jdbc-jar", _non_empty),
        master=get("master", str),
        shuffle_partitions=get("shuffle-partitions", _positive_int),
    )


def _non_empty(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def _terminal_statuses(raw: str) -> tuple[str, ...]:
    allowed = (JobStatus.DELIVERED.value, JobStatus.DEAD.value)
    values = tuple(dict.fromkeys(part.strip().upper() for part in raw.split(",") if part.strip()))
    if not values or any(value not in allowed for value in values):
        raise ValueError("must list DELIVERED and/or DEAD")
    return values


def _header_name(raw: str) -> str:
    if not raw or any(ch in raw for ch in " :\t\r\n"):
        raise ValueError("must be a valid HTTP header name")
    return raw


def _redact_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


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
    consumers = tuple(
        _seed_consumer(parser, key, url) for key, url in _section(parser, "initial-consumers")
    )
    return SeedData(channels=channels, producers=producers, consumers=consumers)


# Ids, names and tokens are stored in VARCHAR(255) columns.
MAX_SEED_FIELD_LENGTH = 255


def _check_lengths(where: str, **fields: str) -> None:
    for field_name, value in fields.items():
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
        raise ConfigError(f"[{key}] type={raw_type!r}: must be push or pull") from None
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
    if url and not _is_absolute_url(url):
        raise ConfigError(f"{where}={url!r}: callback URL must be absolute (http or https)")
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

    return SeedConsumer(
        id=key,
        channel_id=options["channel"],
        name=options.get("name") or key,
        token=options["token"],
        callback_url=url,
        type=consumer_type,
        ack_wait_seconds=optional_int("ack-wait", _positive_int),
        max_ack_pending=optional_int("max-ack-pending", _positive_int),
    )


def _is_absolute_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)


# -- [nats]: the NATS bridge (`webhook-broker bridge`) --------------------------------------------


@dataclass(frozen=True, slots=True)
class NatsConfig:
    """mode=client: one client connection, acks under ack-prefix (any NATS server).
    mode=hybrid: the client connection answers the API; a leafnode connection to leaf-url
    delivers with `$JS.ACK.` replies (msg.metadata works) and receives the acks."""

    mode: str = "client"
    url: str = "nats://127.0.0.1:4222"
    leaf_url: str = ""
    api_prefix: str = "$JS.API"
    ack_prefix: str = "$WB.ACK"
    queue_group: str = "webhook-broker-bridge"
    user: str = ""
    password: str = ""
    token: str = ""
    credentials: str = ""
    leaf_user: str = ""
    leaf_password: str = ""
    leaf_token: str = ""


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


def _build_nats(parser: configparser.ConfigParser) -> NatsConfig:
    mode = _get(parser, "nats", "mode", _nats_mode)
    leaf_url = _get(parser, "nats", "leaf-url", str)
    if mode == "hybrid":
        if not leaf_url:
            raise ConfigError("[nats] leaf-url: mode=hybrid needs the server's leafnode URL")
        _get(parser, "nats", "leaf-url", _nats_url)
    ack_prefix = _get(parser, "nats", "ack-prefix", _nats_prefix)
    if mode == "client" and (ack_prefix + ".").startswith("$JS.ACK."):
        raise ConfigError(
            f"[nats] ack-prefix={ack_prefix!r}: a client connection may not publish with a "
            "$JS.ACK reply (the server refuses it); use mode=hybrid or another prefix"
        )
    return NatsConfig(
        mode=mode,
        url=_get(parser, "nats", "url", _nats_url),
        leaf_url=leaf_url,
        api_prefix=_get(parser, "nats", "api-prefix", _nats_prefix),
        ack_prefix=ack_prefix,
        queue_group=_get(parser, "nats", "queue-group", str),
        user=_get(parser, "nats", "user", str),
        password=_get(parser, "nats", "password", str),
        token=_get(parser, "nats", "token", str),
        credentials=_get(parser, "nats", "credentials", str),
        leaf_user=_get(parser, "nats", "leaf-user", str),
        leaf_password=_get(parser, "nats", "leaf-password", str),
        leaf_token=_get(parser, "nats", "leaf-token", str),
    )
