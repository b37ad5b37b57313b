"""A model's own file patterns (`--include`, `--exclude`): null when it has none and takes the default set.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("include_patterns", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("exclude_patterns", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("exclude_patterns")
        batch.drop_column("include_patterns")
