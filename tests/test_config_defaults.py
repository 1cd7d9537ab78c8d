"""Every default is written once, in the key table: the dataclasses take theirs from it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.config import (
    SECTION_KEYS,
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
    load_config_text,
)

# The section each dataclass is filled from; Config takes [scheduler]'s one key itself.
FILLED_FROM: dict[str, type[Any]] = {
    "rdbms": DatabaseConfig,
    "http": HttpConfig,
    "log": LogConfig,
    "broker": BrokerConfig,
    "consumer-connection": ConsumerConnectionConfig,
    "push": PushConfig,
    "metrics": MetricsConfig,
    "pull": PullConfig,
    "pipeline": PipelineConfig,
    "gateway-auth": GatewayAuthConfig,
    "nats": NatsConfig,
    "scheduler": Config,
}


def _cases() -> list[tuple[str, str, type[Any], dataclasses.Field[Any]]]:
    cases = []
    for section, cls in FILLED_FROM.items():
        by_field = {key.field_name: key for key in SECTION_KEYS[section].values()}
        for field in dataclasses.fields(cls):
            if field.name in by_field:
                cases.append((section, by_field[field.name].name, cls, field))
    return cases


@pytest.mark.parametrize(
    ("section", "key", "cls", "field"),
    _cases(),
    ids=[f"{section}.{key}" for section, key, _, _ in _cases()],
)
def test_a_field_filled_by_a_key_defaults_to_the_tables_parsed_default(
    section: str, key: str, cls: type[Any], field: dataclasses.Field[Any]
) -> None:
    table = SECTION_KEYS[section][key]
    assert field.default is not dataclasses.MISSING, f"{cls.__name__}.{field.name} has no default"
    assert field.default == table.parse(table.default)


def test_every_section_dataclass_has_a_field_filled_from_the_table() -> None:
    # A renamed field (or attr=) would drop out of the parametrized test above silently.
    covered = {cls for _, _, cls, _ in _cases()}
    assert covered == set(FILLED_FROM.values())


def test_built_with_no_arguments_equals_loaded_from_an_empty_file() -> None:
    # Covers the fields a builder derives from keys too: host and port from [http] listener,
    # pool size and overflow from [rdbms] max-idle-connxns and max-open-connxns.
    loaded = load_config_text("")
    assert Config() == loaded
    for section, cls in FILLED_FROM.items():
        if cls is not Config:
            attr = {"rdbms": "database", "consumer-connection": "consumer_connection"}.get(
                section, section.replace("-", "_")
            )
            assert cls() == getattr(loaded, attr), section
