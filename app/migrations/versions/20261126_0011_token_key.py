"""The key channel and producer tokens are hashed with, kept in the database by default

Revision ID: 0011_token_key
Revises: 0010_claim_functions
Create Date: 2026-11-26

Channel and producer tokens are stored as HMAC-SHA256 digests (app/domain/tokens.py). The key is
[http] token-hash-key when set; otherwise the random key made here, so a broker needs no new
setting to upgrade. Rows written before are hashed by the first process that starts
(app/services/tokens.py), with whichever key it has.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_token_key"
down_revision: str | None = "0010_claim_functions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "broker_secret",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_broker_secret"),
    )
    op.bulk_insert(table, [{"name": "token-hash-key", "value": secrets.token_hex(32)}])


def downgrade() -> None:
    op.drop_table("broker_secret")
