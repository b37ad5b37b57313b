"""Models and their local paths.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(63), nullable=False, unique=True),
        sa.Column("owner_name", sa.String(255), nullable=False),
        sa.Column("owner_uid", sa.Integer, nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("repo_id", sa.String(255), nullable=False),
        sa.Column("revision", sa.String(255), nullable=False),
        sa.Column("commit", sa.String(40)),
        sa.Column("token_block", sa.String(255)),
        sa.Column("targets", sa.JSON),
        sa.Column("subpath", sa.Text),
        sa.Column("files", sa.JSON),
        sa.Column("phase", sa.String(16), nullable=False, index=True),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deletion_time", sa.DateTime(timezone=True)),
        sa.Column("cleanup_attempts", sa.Integer, nullable=False),
    )
    op.create_table(
        "local_paths",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False, index=True),
        sa.Column("workspace", sa.String(63), nullable=False),
        sa.Column("cluster", sa.String(255), nullable=False),
        sa.Column("path", sa.Text, nullable=False, index=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("bytes_done", sa.BigInteger, nullable=False),
        sa.Column("bytes_total", sa.BigInteger, nullable=False),
        sa.Column("owned", sa.Boolean, nullable=False),
        sa.Column("holder", sa.String(255)),
        sa.Column("holder_host", sa.String(255)),
        sa.Column("holder_pid", sa.Integer),
        sa.Column("holder_started", sa.Float),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("model_id", "cluster", "path"),
    )


def downgrade() -> None:
    op.drop_table("local_paths")
    op.drop_table("models")
