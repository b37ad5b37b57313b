"""S3 staging of a model's snapshot (with a lease for the staging run), failover attempts per path.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("staging_uri", sa.Text, nullable=True))
        batch.add_column(sa.Column("staging_owned", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("holder", sa.String(255), nullable=True))
        batch.add_column(sa.Column("holder_host", sa.String(255), nullable=True))
        batch.add_column(sa.Column("holder_pid", sa.Integer, nullable=True))
        batch.add_column(sa.Column("holder_started", sa.Float, nullable=True))
        batch.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_models_staging_uri", ["staging_uri"])
    with op.batch_alter_table("local_paths") as batch:
        batch.add_column(sa.Column("failover_attempts", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("local_paths") as batch:
        batch.drop_column("failover_attempts")
    with op.batch_alter_table("models") as batch:
        batch.drop_index("ix_models_staging_uri")
        for column in ("heartbeat_at", "holder_started", "holder_pid", "holder_host", "holder", "staging_owned",
                       "staging_uri"):
            batch.drop_column(column)
