"""The shared Hub request budget.

Revision ID: 0008
Revises: 0007
"""

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
