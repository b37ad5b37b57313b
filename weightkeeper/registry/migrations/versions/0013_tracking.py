"""Models that follow a branch: whether it is tracked, the revision asked for next, the commit being switched to
with its files, when the head was last asked and the last switch; and when a shared copy was switched away from.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("track", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("next_revision", sa.String(255), nullable=True))
        batch.add_column(sa.Column("pending_commit", sa.String(40), nullable=True))
        batch.add_column(sa.Column("pending_files", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("head_checked_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("switched_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("released_at")
    with op.batch_alter_table("models") as batch:
        for column in ("switched_at", "head_checked_at", "pending_files", "pending_commit", "next_revision", "track"):
            batch.drop_column(column)
