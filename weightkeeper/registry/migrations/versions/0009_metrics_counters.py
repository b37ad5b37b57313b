"""Counters and histograms for /metrics, written by every process.

Revision ID: 0009
Revises: 0008
"""

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
