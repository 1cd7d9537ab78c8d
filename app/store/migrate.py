"""Running Alembic from the broker itself (`webhook-broker migrate`, and `serve` on start)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory

from app.config import DatabaseConfig


def sync_url(config: DatabaseConfig) -> str:
    if config.dialect == "sqlite":
        return f"sqlite:///{config.connection_url}"
    return "postgresql+psycopg://" + config.connection_url.split("://", 1)[1]


def migrations_dir() -> Path:
    """The migrations folder, inside the package (the wheel carries it as package data: a
    top-level `migrations` package would collide with anything else of that name)."""
    return Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(config: DatabaseConfig) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["sqlalchemy_url"] = sync_url(config)
    return cfg


def upgrade(config: DatabaseConfig, revision: str = "heads") -> None:
    command.upgrade(alembic_config(config), revision)


def head_revisions(config: DatabaseConfig) -> frozenset[str]:
    """The revisions a current schema is at (read from the migration scripts)."""
    return frozenset(ScriptDirectory.from_config(alembic_config(config)).get_heads())
