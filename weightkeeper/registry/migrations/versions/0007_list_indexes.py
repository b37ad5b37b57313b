"""Indexes for the paginated, filtered model list.

Revision ID: 0007
Revises: 0006
"""

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
