"""Layered loading: built-in defaults, the config files, then the environment, into one Config.

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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from app.config.keys import (
    IGNORED_SECTIONS,
    SECTION_KEYS,
    SECTIONS,
    ConfigError,
    Key,
    Section,
    _nats_url,
    _non_negative_int,
    raw_default,
)
from app.config.model import (
    BrokerConfig,
    Config,
    ConsumerConnectionConfig,
    DatabaseConfig,
    GatewayAuthConfig,
    HttpConfig,
    LogConfig,
    MetricsConfig,
    NatsConfig,
    PipelineConfig,
    PullConfig,
    PushConfig,
    UiConfig,
    pool_sizes,
)
from app.config.seed import SEED_SECTIONS, build_seed

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
    raw = parser.get(
        "pipeline", "retention-days", fallback=raw_default("pipeline", "retention-days")
    )
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
        ui=_fill(UiConfig, values["ui"]),
        min_schedule_delay_minutes=values["scheduler"]["min_schedule_delay_minutes"],
        seed=build_seed(parser),
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
    pool_size, max_overflow = pool_sizes(values["max_idle_connxns"], values["max_open_connxns"])
    return _fill(
        DatabaseConfig,
        {**values, "connection_url": url, "pool_size": pool_size, "max_overflow": max_overflow},
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
