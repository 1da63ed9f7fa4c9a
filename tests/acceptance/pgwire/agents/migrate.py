"""An agent that applies a migration with psycopg, in one explicit transaction, then
goes on to the next step of its task (which a test may kill it before).

    python migrate.py [--protocol extended|simple|pipeline] [--pause-after-commit]

It prints ``committed`` once its COMMIT has returned, and ``done`` at the end.
"""

import argparse
import os
import sys
import time

import psycopg

STATEMENTS = [
    "ALTER TABLE orders ADD COLUMN status text NOT NULL DEFAULT 'new'",
    "CREATE INDEX orders_by_status ON orders (status)",
    "/* sidecar:key=seed-order-statuses */ "
    "INSERT INTO order_statuses (name) VALUES ('new'), ('paid'), ('shipped') RETURNING name",
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--protocol", choices=["extended", "simple", "pipeline"], default="extended"
    )
    parser.add_argument("--pause-after-commit", action="store_true")
    parser.add_argument("--pause-before-commit", action="store_true")
    args = parser.parse_args()
    cursor_factory = psycopg.ClientCursor if args.protocol == "simple" else psycopg.Cursor
    with psycopg.connect(os.environ["DATABASE_URL"], cursor_factory=cursor_factory) as db:
        seeded: list[str] = []
        with db.transaction():
            if args.protocol == "pipeline":
                with db.pipeline():
                    cursors = [db.execute(sql) for sql in STATEMENTS]
                seeded = [row[0] for row in cursors[-1].fetchall()]
            else:
                for sql in STATEMENTS:
                    cursor = db.execute(sql)
                seeded = [row[0] for row in cursor.fetchall()]
            print("applied " + ",".join(seeded), flush=True)
            if args.pause_before_commit:
                time.sleep(120)
        print("committed", flush=True)
        if args.pause_after_commit:
            time.sleep(120)  # about to write its checkpoint: the moment it is killed
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
