"""One lease table for every kind of exclusive work, instead of lease columns on four tables.

Leases held while upgrading are dropped: stop every run before upgrading.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
LEASE_COLUMNS = ("holder", "holder_host", "holder_pid", "holder_started", "heartbeat_at")


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("key", sa.Integer, primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False, server_default=""),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    op.drop_table("model_runs")
    for table in ("models", "local_paths", "artifacts"):
        with op.batch_alter_table(table) as batch:
            for column in LEASE_COLUMNS:
                batch.drop_column(column)


def downgrade() -> None:
    for table in ("models", "local_paths", "artifacts"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("holder", sa.String(255)))
            batch.add_column(sa.Column("holder_host", sa.String(255)))
            batch.add_column(sa.Column("holder_pid", sa.Integer))
            batch.add_column(sa.Column("holder_started", sa.Float))
            batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True)))
    op.create_table(
        "model_runs",
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("flow", sa.String(32), nullable=False),
        sa.Column("holder", sa.String(255)),
        sa.Column("holder_host", sa.String(255)),
        sa.Column("holder_pid", sa.Integer),
        sa.Column("holder_started", sa.Float),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
    )
    op.drop_table("leases")
