"""Read webhook-broker.cfg (INI) into one frozen, validated Config.

Every key is declared once, in SECTIONS (keys): its default, parser, help text and whether we
act on it. The dataclasses (model) default to it, and the loader (load), the seed sections
(seed) and webhook-broker.cfg.template (template; `python -m app.config >
webhook-broker.cfg.template`) are built from it. Importers use this package's names only.
"""

from app.config.keys import (
    DEFAULT_DENIED_CALLBACK_NETWORKS,
    DEFAULTS,
    IGNORED_SECTIONS,
    SECTION_KEYS,
    SECTIONS,
    ConfigError,
    Key,
    Section,
    default,
    raw_default,
)
from app.config.load import (
    CONFIG_NAME,
    ENV_PREFIX,
    default_locations,
    load_config,
    load_config_text,
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
    SeedConsumer,
    SeedData,
    SeedStakeholder,
    is_loopback_host,
)
from app.config.seed import MAX_SEED_FIELD_LENGTH, SEED_SECTIONS
from app.config.template import render_template

__all__ = [
    "CONFIG_NAME",
    "DEFAULTS",
    "DEFAULT_DENIED_CALLBACK_NETWORKS",
    "ENV_PREFIX",
    "IGNORED_SECTIONS",
    "MAX_SEED_FIELD_LENGTH",
    "SECTIONS",
    "SECTION_KEYS",
    "SEED_SECTIONS",
    "BrokerConfig",
    "Config",
    "ConfigError",
    "ConsumerConnectionConfig",
    "DatabaseConfig",
    "GatewayAuthConfig",
    "HttpConfig",
    "Key",
    "LogConfig",
    "MetricsConfig",
    "NatsConfig",
    "PipelineConfig",
    "PullConfig",
    "PushConfig",
    "Section",
    "SeedConsumer",
    "SeedData",
    "SeedStakeholder",
    "default",
    "default_locations",
    "is_loopback_host",
    "load_config",
    "load_config_text",
    "raw_default",
    "render_template",
]
