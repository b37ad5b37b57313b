"""The paginated, filtered model list: a model's snapshot size (backfilled from its files) and indexes for the
list's sorts, alone and after an equality filter (phase, owner), so that a page is read in order.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
SORTS = {"name": ["name"], "created_at_id": ["created_at", "id"], "size_bytes_id": ["size_bytes", "id"]}
MODEL_INDEXES = {"ix_models_created_at_id": SORTS["created_at_id"], "ix_models_size_bytes_id": SORTS["size_bytes_id"],
                 **{f"ix_models_{column}_{name}": [column, *columns] for column in ("phase", "owner_name")
                    for name, columns in SORTS.items()}}


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("size_bytes", sa.BigInteger, nullable=False, server_default="0"))
        for name, columns in MODEL_INDEXES.items():
            batch.create_index(name, columns)
    with op.batch_alter_table("local_paths") as batch:
        batch.create_index("ix_local_paths_workspace_model_id", ["workspace", "model_id"])
    models = sa.table("models", sa.column("id", sa.Integer), sa.column("files", sa.JSON),
                      sa.column("size_bytes", sa.BigInteger))
    conn = op.get_bind()
    sizes = [{"key": id_, "size": sum(int(f.get("size") or 0) for f in files)}
             for id_, files in conn.execute(sa.select(models.c.id, models.c.files)) if files]
    if sizes:
        conn.execute(models.update().where(models.c.id == sa.bindparam("key")).values(size_bytes=sa.bindparam("size")),
                     sizes)


def downgrade() -> None:
    with op.batch_alter_table("local_paths") as batch:
        batch.drop_index("ix_local_paths_workspace_model_id")
    with op.batch_alter_table("models") as batch:
        for name in MODEL_INDEXES:
            batch.drop_index(name)
        batch.drop_column("size_bytes")
