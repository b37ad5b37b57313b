"""The list's sorts by creation time and by size break ties by the model's name, not its id: a cursor holds the
last model's key, and ids count every model declared (other users' private ones too), names only the user's own.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
SORTS = ("created_at", "size_bytes")


def _indexes(tie: str) -> dict[str, list[str]]:
    return {f"ix_models_{'_'.join(columns)}": columns
            for columns in ([*before, sort, tie] for sort in SORTS for before in ([], ["phase"], ["owner_name"]))}


def upgrade() -> None:
    _replace(_indexes("id"), _indexes("name"))


def downgrade() -> None:
    _replace(_indexes("name"), _indexes("id"))


def _replace(old: dict[str, list[str]], new: dict[str, list[str]]) -> None:
    with op.batch_alter_table("models") as batch:
        for name in old:
            batch.drop_index(name)
        for name, columns in new.items():
            batch.create_index(name, columns)
