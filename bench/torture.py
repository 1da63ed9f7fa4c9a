"""Randomized kill test: an outside agent, its sidecar, or both, SIGKILLed at random
instants; the outside world counted after each task (issue 12's proof of exactly-once).

    ./run bench torture [--iterations 50] [--seed 1]

Each iteration is a new task of six effects (two charges on an Idempotency-Key API, two
things with a probe, two "late" things answered after up to 1.5 s, past the rule's 1 s
timeout) run by ``tests.support.torture_agent`` under `sidecar exec`, with one SIGKILL
at a uniformly random instant of the first run (agent, sidecar or both; a killed sidecar
is restarted on the same data), then new attempts until the agent finishes.  Prints a row
per iteration and the totals; exits 1 if any effect was duplicated or lost, or an
agent-only kill ever left an effect to a human.  The suite runs a few iterations of the
same (tests/acceptance/proxy/test_torture.py).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from tests.support.stack import Stack
from tests.support.torture import report, run_iteration

REPO = Path(__file__).resolve().parents[1]
RULES = [REPO / "rules" / "idempotency-key.yaml", REPO / "tests/acceptance/proxy/things.yaml"]
HOSTS = ["api.example-payments.com", "api.things.test"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="es-torture-") as root:
        stack = Stack.start(Path(root), rules=RULES, hosts=HOSTS)
        try:
            for number in range(1, args.iterations + 1):
                verdict = run_iteration(stack, rng, number)
                verdicts.append(verdict)
                print(
                    f"{number}/{args.iterations}: {verdict.victim} at {verdict.kill_at_s}s, "
                    f"{verdict.runs} run(s), {'ok' if verdict.ok else 'FAIL'}",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            stack.close()
    print(report(verdicts))
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
