"""Counters and histograms for /metrics, written by every process.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "metric_counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("labels", sa.String(255), primary_key=True),
        sa.Column("le", sa.String(16), primary_key=True),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("total", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("metric_counters")
