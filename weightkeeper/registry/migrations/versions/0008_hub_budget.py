"""The shared Hub request budget.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_table(
        "hub_budget",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("bucket", sa.String(16), primary_key=True),
        sa.Column("slot", sa.BigInteger, nullable=False),
        sa.Column("counts", sa.JSON, nullable=False),
        sa.Column("blocked_until", sa.Float, nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("throttled", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hub_budget")
