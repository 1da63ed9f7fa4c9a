"""An outside agent for the randomized kill test: six effects, then ``finished``.

    python -m tests.support.torture_agent TAG SEED

Knows nothing of the sidecar beyond its HTTP answers (it runs under `sidecar exec`, which
sets the proxy and the CA): it charges two orders (an API that dedupes on an
Idempotency-Key), creates two things (no key; a probe settles an unknown outcome), and
two "late" things whose answer comes after up to 1.5 s, longer than the rule waits.  A
step is retried while the sidecar says "later" (503 with Retry-After, 502/504, a
connection error) and given up on 409 ``effect_unknown`` (exit 3: a human must look).

Every effect is named from TAG alone, so a rerun (a new attempt) repeats exactly the
same work from the top, as a restarted agent does.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import requests

PATIENCE_S = 90.0


def steps(tag: str, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    late = [round(rng.uniform(0.0, 1.5), 2) for _ in range(2)]
    things = "https://api.things.test/repos/acme/app/things"
    late_things = "https://api.things.test/late/things"
    charges = "https://api.example-payments.com/v1/charges"
    return [
        {"url": charges, "json": {"amount": 100}, "headers": {"X-Order-Id": f"{tag}-1"}},
        {"url": things, "json": {"name": f"{tag}-2"}},
        {"url": f"{late_things}?delay={late[0]}", "json": {"name": f"{tag}-3"}},
        {"url": charges, "json": {"amount": 400}, "headers": {"X-Order-Id": f"{tag}-4"}},
        {"url": things, "json": {"name": f"{tag}-5"}},
        {"url": f"{late_things}?delay={late[1]}", "json": {"name": f"{tag}-6"}},
    ]


def attempt(session: requests.Session, step: dict[str, Any]) -> tuple[str, float]:
    """One try: ("done" | "later" | "blocked" | "error", pause before the next try)."""
    try:
        answer = session.post(
            step["url"], json=step["json"], headers=step.get("headers"), timeout=30
        )
    except requests.RequestException as error:
        print(f"connection error: {type(error).__name__}", flush=True)
        return "later", 0.2
    if answer.status_code in (200, 201):
        return "done", 0.0
    try:
        code = answer.json().get("code")
    except ValueError:
        code = None
    if answer.status_code == 409 and code == "effect_unknown":
        return "blocked", 0.0
    if answer.status_code in (502, 503, 504):
        pause = float(answer.headers.get("Retry-After", "0.2") or 0.2)
        return "later", min(pause, 2.0)
    print(f"error {answer.status_code} {code}: {answer.text[:300]}", flush=True)
    return "error", 0.0


def main() -> int:
    tag, seed = sys.argv[1], int(sys.argv[2])
    print(f"pid {os.getpid()}", flush=True)
    session = requests.Session()
    for number, step in enumerate(steps(tag, seed), start=1):
        deadline = time.monotonic() + PATIENCE_S
        while True:
            outcome, pause = attempt(session, step)
            if outcome == "done":
                print(json.dumps({"step": number}), flush=True)
                break
            if outcome == "blocked":
                print(f"blocked at step {number}", flush=True)
                return 3
            if outcome == "error" or time.monotonic() > deadline:
                return 1
            time.sleep(pause)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
