"""What the sidecar sends and answers is what came: an effect goes to the host the agent
named with the target it sent (a path that starts with ``//`` is a path there, not
another host, as a URL reference would read it), and the answer's header values reach
the agent with the bytes the upstream wrote, first time and replayed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


# An agent that posts the same named thing twice and prints, per answer, the bytes of
# the X-Thing-Name header (http.client reads header values as Latin-1: one char a byte).
HEADER_AGENT = """
import json, sys
import requests
for _ in range(2):
    r = requests.post(sys.argv[1], json={"name": sys.argv[2]}, timeout=30)
    raw = r.headers["X-Thing-Name"].encode("latin-1")
    print(json.dumps({"effect": r.headers["X-Sidecar-Effect"], "hex": raw.hex()}), flush=True)
print("done", flush=True)
"""


def _run_script_agent(
    tmp_path: Path, task: str, source: str, *args: str
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Run ``source`` as the agent under ``sidecar exec`` with the hooks rule until it
    prints ``done``; its JSON lines, and the requests the counting upstream got."""
    rules = tmp_path / "hooks.yaml"
    rules.write_text(RULES)
    agent = tmp_path / f"{task}.py"
    agent.write_text(source)
    stack = Stack.start(tmp_path / "stack", rules=[rules], hosts=[HOST])
    try:
        run = stack.exec_agent(task, agent, *args)
        run.wait_for("^done$", timeout=60)
        assert run.proc.wait(timeout=30) == 0
        answers = [json.loads(line) for line in run.lines if line.startswith("{")]
        made: dict[str, int] = stack.counts()["requests"]
    finally:
        stack.close()
    return answers, made


def test_a_header_value_reaches_the_agent_with_the_upstreams_bytes(tmp_path: Path) -> None:
    answers, _ = _run_script_agent(
        tmp_path, "t-header", HEADER_AGENT, f"https://{HOST}/named/things", "café №1"
    )
    sent = "café №1".encode()  # aiohttp's upstream writes the text as UTF-8
    assert answers == [
        {"effect": "recorded", "hex": sent.hex()},
        {"effect": "replayed", "hex": sent.hex()},
    ]


# An agent that posts the same thing twice to an API answering 204 No Content, on one
# kept-alive connection, and prints, per answer, its status and the header fields it came
# with; then asks something else on that connection (a 204 with a body would spoil it).
NO_CONTENT_AGENT = """
import json, sys
import requests
with requests.Session() as http:
    for _ in range(2):
        r = http.post(sys.argv[1], json={"name": "quiet"}, timeout=30)
        print(json.dumps({"status": r.status_code, "effect": r.headers["X-Sidecar-Effect"],
                          "fields": sorted(n.lower() for n in r.headers)}), flush=True)
    after = http.post(sys.argv[1].replace("/quiet/", "/named/"), json={"name": "x"}, timeout=30)
    print(json.dumps({"status": after.status_code}), flush=True)
print("done", flush=True)
"""


def test_a_no_content_answer_reaches_the_agent_without_a_length(tmp_path: Path) -> None:
    """RFC 9110 §8.6: a server must not send Content-Length with a 204; the sidecar
    answers a matched request itself, first time and replayed, and sent ``0``."""
    answers, made = _run_script_agent(
        tmp_path, "t-no-content", NO_CONTENT_AGENT, f"https://{HOST}/quiet/things"
    )
    assert made == {"POST /quiet/things": 1, "POST /named/things": 1}
    quiet, after = answers[:2], answers[2]
    assert [(a["status"], a["effect"]) for a in quiet] == [(204, "recorded"), (204, "replayed")]
    assert all("content-length" not in a["fields"] for a in quiet), quiet
    assert after == {"status": 201}
