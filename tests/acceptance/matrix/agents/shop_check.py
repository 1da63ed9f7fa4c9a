"""The outside world is right for one order: one charge, one invoice, one receipt.

    python shop_check.py UPSTREAM_URL        (the order: SIDECAR_MATRIX_TASK)

Counted on the counting upstream itself, not on anything the sidecar says.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def fetch(url: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        found: list[dict[str, object]] = json.load(answer)
    return found


def main() -> int:
    upstream, order = sys.argv[1], os.environ["SIDECAR_MATRIX_TASK"]
    charges = [c for c in fetch(f"{upstream}/_upstream/charges") if c["order"] == order]
    things = [t["name"] for t in fetch(f"{upstream}/_upstream/things")]
    counts = {
        "charges": len(charges),
        "invoices": things.count(f"{order}-invoice"),
        "receipts": things.count(f"{order}-receipt"),
    }
    wrong = {name: n for name, n in counts.items() if n != 1}
    print(f"order {order}: " + ", ".join(f"{n} {name}" for name, n in counts.items()))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
