"""customers get an email, looked up by an index"""

import sqlalchemy as sa
from alembic import op
from pause import maybe

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("customers", sa.Column("email", sa.Text))
    op.create_index("customers_by_email", "customers", ["email"])
    maybe("0002")


def downgrade() -> None:
    op.drop_index("customers_by_email", "customers")
    op.drop_column("customers", "email")
