"""A small bookkeeping agent, written only for the matrix tests: SQL effects.

    python ledger_agent.py          (DATABASE_URL and SIDECAR_TASK from the environment)

For the order named by SIDECAR_TASK it opens a ledger entry and posts two lines, each in
a transaction of its own, with psycopg over DATABASE_URL (the sidecar's relay, as
`sidecar matrix --pg-upstream` sets it).  Any error makes it exit 1.
"""

from __future__ import annotations

import os

import psycopg

TABLE = "CREATE TABLE IF NOT EXISTS matrix_ledger (task text NOT NULL, entry text NOT NULL)"


def main() -> None:
    order = os.environ["SIDECAR_TASK"]
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as connection:
        connection.execute(TABLE)
        for entry in ("opened", "charged", "shipped"):
            with connection.transaction():
                connection.execute(
                    "INSERT INTO matrix_ledger (task, entry) VALUES (%s, %s)", (order, entry)
                )
            print("posted", entry, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
