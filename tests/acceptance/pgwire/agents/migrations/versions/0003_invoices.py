"""invoices"""

import sqlalchemy as sa
from alembic import op
from pause import maybe

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "invoices",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("customer_id", sa.Integer, sa.ForeignKey("customers.id")),
    )
    maybe("0003")


def downgrade() -> None:
    op.drop_table("invoices")
