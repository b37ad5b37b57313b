"""The lease of the lifecycle run (ensure-model or delete-model) working on a model.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
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


def downgrade() -> None:
    op.drop_table("model_runs")
