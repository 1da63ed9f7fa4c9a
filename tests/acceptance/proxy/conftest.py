"""A running stack (counting upstream + sidecar) and a way to run agents under it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.testing.processes import Child
from tests.acceptance.conftest import REPO
from tests.support.stack import Stack

HERE = Path(__file__).parent
AGENT = HERE / "agents" / "agent.py"
RULES = [
    REPO / "rules" / "idempotency-key.yaml",
    REPO / "rules" / "llm-cache.yaml",
    HERE / "things.yaml",
]
HOSTS = [
    "api.example-payments.com",
    "api.openai.com",
    "api.things.test",
    "strict.things.test",
    "blocked.things.test",
    "files.test",
]


@pytest.fixture
def make_stack(tmp_path: Path) -> Iterator[Any]:
    stacks: list[Stack] = []

    def make(**kwargs: Any) -> Stack:
        stack = Stack.start(tmp_path / f"stack{len(stacks)}", rules=RULES, hosts=HOSTS, **kwargs)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


@pytest.fixture
def stack(make_stack: Any) -> Stack:
    return make_stack()


def start_agent(
    stack: Stack, task: str, client: str, steps: list[dict[str, Any]], **kw: Any
) -> Child:
    return stack.exec_agent(task, AGENT, client, json.dumps(steps), **kw)


def results(agent: Child) -> list[dict[str, Any]]:
    return [json.loads(line) for line in agent.lines if line.startswith("{")]


def run_agent(
    stack: Stack, task: str, client: str, steps: list[dict[str, Any]], **kw: Any
) -> list[dict[str, Any]]:
    """Run an agent to completion under `sidecar exec`; return its JSON result lines."""
    agent = start_agent(stack, task, client, steps, **kw)
    agent.wait_for("^done$", timeout=90)
    assert agent.proc.wait(timeout=30) == 0, stack.root / "agent.log"
    return results(agent)


def charge(order: str, amount: int = 500, **extra: Any) -> dict[str, Any]:
    return {
        "method": "POST",
        "url": "https://api.example-payments.com/v1/charges",
        "json": {"amount": amount},
        "headers": {"X-Order-Id": order, "Authorization": "Bearer sk_live_4eC39HqLyjWDarjtT1zdp7dc"}
        | extra,
    }


def thing(
    name: str, host: str = "api.things.test", path: str = "/repos/acme/app/things", **body: Any
) -> dict[str, Any]:
    return {"method": "POST", "url": f"https://{host}{path}", "json": {"name": name} | body}


def settled_effects(
    stack: Stack, task: str, events: int, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The task's effects once the first one has ``events`` audit lines.

    Replay and probe notes are written after the agent is answered (they forward
    nothing), so a test that reads the trail right after the answer polls briefly.
    """
    deadline = time.monotonic() + timeout
    while True:
        effects = stack.effects(task)
        if (effects and len(effects[0]["events"]) >= events) or time.monotonic() > deadline:
            return effects
        time.sleep(0.05)
