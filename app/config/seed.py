"""Seeds: the [initial-*] sections and one section per seeded consumer, into SeedData."""

from __future__ import annotations

import configparser
from collections.abc import Callable, Mapping, Sequence

from app.config.keys import ConfigError, _positive_int
from app.config.model import SeedConsumer, SeedData, SeedStakeholder
from app.domain.callbacks import parse_callback_url
from app.domain.errors import InvalidInput
from app.domain.models import ConsumerType
from app.domain.priority import parse_policy, priority_settings

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


def _section(parser: configparser.ConfigParser, name: str) -> Sequence[tuple[str, str]]:
    if not parser.has_section(name):
        return ()
    return [(key, value.strip()) for key, value in parser.items(name)]


def build_seed(parser: configparser.ConfigParser) -> SeedData:
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
