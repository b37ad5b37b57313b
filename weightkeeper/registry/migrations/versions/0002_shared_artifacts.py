"""Shared snapshot copies (artifacts), download policy and keep-files.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("repo_id", sa.String(255), nullable=False),
        sa.Column("commit", sa.String(40), nullable=False),
        sa.Column("cluster", sa.String(255), nullable=False),
        sa.Column("volume", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("files", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("verified_at", sa.DateTime(timezone=True)),
        sa.Column("unreachable_since", sa.DateTime(timezone=True)),
        sa.Column("holder", sa.String(255)),
        sa.Column("holder_host", sa.String(255)),
        sa.Column("holder_pid", sa.Integer),
        sa.Column("holder_started", sa.Float),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("cluster", "path"),
    )
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("download_policy", sa.String(32), nullable=False, server_default="always-download"))
        batch.add_column(sa.Column("keep_files", sa.Boolean, nullable=False, server_default=sa.false()))
    with op.batch_alter_table("local_paths") as batch:
        batch.add_column(sa.Column("artifact_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("retired", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("adopted", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.create_index("ix_local_paths_artifact_id", ["artifact_id"])
        batch.create_foreign_key("fk_local_paths_artifact", "artifacts", ["artifact_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("local_paths") as batch:
        batch.drop_constraint("fk_local_paths_artifact", type_="foreignkey")
        batch.drop_index("ix_local_paths_artifact_id")
        batch.drop_column("adopted")
        batch.drop_column("retired")
        batch.drop_column("verified_at")
        batch.drop_column("artifact_id")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("keep_files")
        batch.drop_column("download_policy")
    op.drop_table("artifacts")
