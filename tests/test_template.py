"""The config template documents every key with its real default, and loads as it is."""

from __future__ import annotations

import configparser
from pathlib import Path

from app.config import DEFAULTS, load_config_text

TEMPLATE = Path(__file__).resolve().parents[1] / "webhook-broker.cfg.template"


def test_template_lists_every_key_with_its_default() -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(TEMPLATE, encoding="utf-8")
    for section, keys in DEFAULTS.items():
        assert parser.has_section(section), section
        assert set(parser[section]) == set(keys), section
        for key, default in keys.items():
            assert parser[section][key] == default, f"[{section}] {key}"


def test_template_loads_as_a_config() -> None:
    config = load_config_text(TEMPLATE.read_text(encoding="utf-8"))
    assert config.database.dialect == "sqlite"
    assert config.seed.channels == ()


def test_a_misspelt_section_fails_with_its_name() -> None:
    import pytest

    from app.config import ConfigError

    with pytest.raises(ConfigError, match=r"\[brokr\]: unknown section"):
        load_config_text("[brokr]\nmax-retry=3\n")
    # Sections of the Go original that we accept but do not use stay harmless.
    load_config_text("[scheduler]\nscheduler-interval-ms=5000\n")
