"""A small order agent, written only for the matrix tests; it knows nothing of the sidecar.

    python shop_agent.py

For the order named by SIDECAR_TASK it charges the customer, then files an invoice and a
receipt (two "things"), through whatever proxy the environment names.  Every request
carries a fresh ``request_id`` in its body, as many SDKs do.  It exits 0 when every call
was answered 2xx, 1 on anything else: an agent that gives up and is restarted.
"""

from __future__ import annotations

import os
import sys
import uuid

import requests

API = "https://api.shop.test"


def post(session: requests.Session, path: str, body: dict[str, object], **headers: str) -> None:
    body = body | {"request_id": str(uuid.uuid4())}
    try:
        answer = session.post(f"{API}{path}", json=body, headers=headers, timeout=60)
    except requests.RequestException as error:
        print(f"gave up on {path}: {error}", flush=True)
        sys.exit(1)
    print(answer.status_code, path, answer.headers.get("X-Sidecar-Effect", "-"), flush=True)
    if answer.status_code >= 300:
        sys.exit(1)


def main() -> None:
    order = os.environ["SIDECAR_TASK"]
    with requests.Session() as session:
        post(session, "/v1/charges", {"amount": 1200}, **{"X-Order-Id": order})
        post(session, "/repos/acme/shop/things", {"name": f"{order}-invoice"})
        post(session, "/repos/acme/shop/things", {"name": f"{order}-receipt"})
    print("done", flush=True)


if __name__ == "__main__":
    main()
