"""A few iterations of the randomized kill test (``./run bench torture`` runs fifty):
agent, sidecar or both SIGKILLed at random instants, resumed until done, the outside
world counted - no effect twice, none lost, none left to a human by an agent's death."""

from __future__ import annotations

import random

import pytest

from tests.support.torture import VICTIMS, report, run_iteration

pytestmark = pytest.mark.acceptance


def test_random_kills_never_duplicate_or_lose_an_effect(make_stack):
    stack = make_stack()
    rng = random.Random(20261201)
    verdicts = [run_iteration(stack, rng, number) for number in range(1, 3)]
    # Whatever the draw, each kind of victim is also killed early in the run, while
    # effects are in flight.
    for number, victim in enumerate(VICTIMS, start=3):
        verdicts.append(run_iteration(stack, rng, number, victim=victim, kill_window_s=1.5))
    print(report(verdicts))
    assert all(v.ok for v in verdicts), report(verdicts)
