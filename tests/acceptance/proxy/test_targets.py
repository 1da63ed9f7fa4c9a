"""An effect is sent to the host the agent named, with the target it sent: a path that
starts with ``//`` is a path there, not another host (as a URL reference would read it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.proxy.conftest import run_agent
from tests.support.stack import Stack

HOST = "hooks.things.test"
# A rule with no path condition matches whatever path the agent sends to its host.
RULES = f"""\
version: 1
rules:
  - name: test.hooks.post
    description: Any POST to the hooks host is one effect per body name.
    match: {{host: {HOST}, method: POST}}
    effect: non_idempotent
    key: "hook:{{body.name}}"
    on_unknown: block
"""


@pytest.mark.parametrize("client", ["requests", "httpx"])
def test_a_double_slash_path_goes_to_the_named_host_as_sent(tmp_path: Path, client: str) -> None:
    rules = tmp_path / "hooks.yaml"
    rules.write_text(RULES)
    stack = Stack.start(tmp_path / "stack", rules=[rules], hosts=[HOST])
    try:
        step = {
            "method": "POST",
            "url": f"https://{HOST}//elsewhere.test/v1/charges?note=x",
            "json": {"name": "first"},
        }
        (answer,) = run_agent(stack, "t-targets", client, [step])
        requests = stack.counts()["requests"]
        effects = stack.effects("t-targets")
    finally:
        stack.close()
    # The counting upstream got it, at the path sent; it has no such route, so 404.
    assert requests == {"POST //elsewhere.test/v1/charges": 1}
    assert (answer["status"], answer["x-sidecar-effect"]) == (404, "recorded")
    assert [(e["state"], e["request"]["url"]) for e in effects] == [
        ("failed", f"https://{HOST}:443//elsewhere.test/v1/charges?note=x")
    ]
