"""On PostgreSQL, a model's targets as JSONB: the list's visibility rule tests them with `?|` on every row, and a
JSON column was cast (parsed) on each test.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE models ALTER COLUMN targets TYPE jsonb USING targets::jsonb")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE models ALTER COLUMN targets TYPE json USING targets::json")
