"""Each revision in a transaction of its own (transaction_per_migration): a kill part-way
leaves the revisions before it committed and the one in flight rolled back."""

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine

if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name)

url = os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1)
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()
