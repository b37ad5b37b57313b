"""The request that declared a model (a digest of its caller, `Idempotency-Key` and body), so that the same request
repeated answers with the model it made instead of a conflict.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("request_key", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("request_key")
