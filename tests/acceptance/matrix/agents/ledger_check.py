"""The outside world is right for one order: each ledger line exactly once.

    python ledger_check.py DATABASE_URL      (the order: SIDECAR_MATRIX_TASK)

Counted in the database itself, directly, not through the sidecar.
"""

from __future__ import annotations

import os
import sys

import psycopg


def main() -> int:
    order = os.environ["SIDECAR_MATRIX_TASK"]
    with psycopg.connect(sys.argv[1]) as connection:
        rows = connection.execute(
            "SELECT entry, count(*) FROM matrix_ledger WHERE task = %s GROUP BY entry", (order,)
        ).fetchall()
    counts = dict(rows)
    print(f"order {order}: " + ", ".join(f"{n} {entry}" for entry, n in sorted(counts.items())))
    return 0 if counts == {"opened": 1, "charged": 1, "shipped": 1} else 1


if __name__ == "__main__":
    sys.exit(main())
