"""What weightkeeper made at each path (a link, or a directory's dev:inode), so removal takes only that.

Entries that already held files are marked `legacy`: removed as before this was kept.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("local_paths") as batch:
        batch.add_column(sa.Column("made", sa.String(64)))
    op.execute("UPDATE local_paths SET made = 'legacy' WHERE owned")


def downgrade() -> None:
    with op.batch_alter_table("local_paths") as batch:
        batch.drop_column("made")
