"""What weightkeeper made at each shared copy (its directory's dev:inode), so it never adopts, trusts or removes a
directory someone else put at a copy's path. Copies recorded before are marked `legacy`: trusted as before.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("made", sa.String(64)))
    op.execute("UPDATE artifacts SET made = 'legacy'")


def downgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("made")
