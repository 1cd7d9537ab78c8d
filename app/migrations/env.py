"""Alembic environment: a synchronous engine on the broker's configured database."""

from __future__ import annotations

import re
from typing import Any

from alembic import context
from sqlalchemy import create_engine, text

from app.config import load_config
from app.store.migrate import sync_url
from app.store.schema import metadata

config = context.config


PARTITION = re.compile(r"(job|message)_p\d+")


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """The job and message tables' partitions (job_p<n>, message_p<n>, made by the sweeper) are
    not models of their own."""
    return not (type_ == "table" and name is not None and PARTITION.fullmatch(name))


def include_object(obj: Any, _name: str | None, type_: str, reflected: bool, _other: Any) -> bool:
    """Nor are the foreign keys PostgreSQL adds from a table to each partition of one it
    references (job's and message_key's to message_p<n>)."""
    if type_ == "foreign_key_constraint" and reflected:
        return not PARTITION.fullmatch(obj.referred_table.name)
    return True


url = config.attributes.get("sqlalchemy_url") or sync_url(load_config().database)


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(url)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            # Instances starting together migrate one at a time.
            connection.execute(text("SELECT pg_advisory_lock(8071950101)"))
            connection.commit()
        try:
            context.configure(
                connection=connection,
                target_metadata=metadata,
                render_as_batch=connection.dialect.name == "sqlite",
                compare_type=True,
                include_name=include_name,
                include_object=include_object,
            )
            with context.begin_transaction():
                context.run_migrations()
            if connection.dialect.name == "sqlite":
                # WAL is kept in the file: set once here, the broker's connections find it
                # instead of each asking to switch (a switch needs the file to itself).
                connection.exec_driver_sql("PRAGMA journal_mode=WAL")
                connection.commit()
        finally:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_unlock(8071950101)"))
                connection.commit()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
