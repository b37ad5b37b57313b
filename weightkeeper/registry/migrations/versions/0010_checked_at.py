"""When each copy last passed the cheap check, so that a pass checks only the copies due.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    for table in ("local_paths", "artifacts"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in ("local_paths", "artifacts"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("checked_at")
