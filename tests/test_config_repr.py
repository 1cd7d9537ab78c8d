"""A %r of the config (a log line, a traceback's locals) never shows a database password."""

from __future__ import annotations

import pytest

from app.config import load_config_text


@pytest.mark.parametrize(
    ("section", "secret"),
    [
        (
            "[rdbms]\ndialect=postgresql\nconnection-url=postgresql://u:s3cret-pw@db:5432/b\n",
            "s3cret-pw",
        ),
        (
            "[rdbms]\ndialect=postgresql\nconnection-url=postgresql://db/b?password=s3cret-pw\n"
            "replica-url=postgresql://u:replica-pw@r/b\n",
            "replica-pw",
        ),
    ],
)
def test_the_database_config_repr_hides_urls(section: str, secret: str) -> None:
    config = load_config_text(section)
    assert secret in config.database.connection_url + config.database.replica_url
    assert secret not in repr(config.database)
    assert secret not in repr(config)
    assert "postgresql" in repr(config.database)
