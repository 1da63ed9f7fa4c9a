"""A human settles a blocked effect, as an operator would: real sidecar, real agents
under `sidecar exec`, the real CLI against the control API (SPEC §3.10)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from aiohttp import web

from sidecar.testing.served import ThreadedApp
from tests.acceptance.proxy.conftest import results, run_agent, start_agent, thing
from tests.support.stack import Stack

RULES = """
rules:
  - name: test.things.settled
    description: A slow API with no probe and no idempotency key - a late answer is for a human.
    match: {host: settle.things.test, method: POST, path: /slow/things}
    effect: non_idempotent
    key: "settle#thing:{body.name}"
    on_unknown: block
    timeout_s: 0.5
    settle_s: 0.5
"""
KEY = "settle#thing:gear"


def resolve(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """`sidecar effects resolve` against the running sidecar (HOST:PORT, no scheme), asked
    again while the first try could still land (refused with exit 1 until then)."""
    control = stack.control_url.removeprefix("http://")
    command = [sys.executable, "-m", "sidecar", "effects", "resolve", "312", KEY, *args]
    deadline = time.monotonic() + 20
    while True:
        done = subprocess.run(
            [*command, "--control", control],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 1 or "could still land" not in done.stderr:
            return done
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.3)


def receiver(events: list[dict]) -> web.Application:
    """An operator's webhook endpoint: keeps what `serve --notify` posts; fails the first
    post (503), so the sidecar must retry it."""

    async def receive(request: web.Request) -> web.Response:
        if not events and not getattr(receive, "failed", False):
            receive.failed = True  # type: ignore[attr-defined]
            return web.Response(status=503)
        events.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hooks/sidecar", receive)
    return app


def test_a_blocked_effect_settled_by_a_human_is_answered_from_the_evidence(tmp_path: Path):
    rules = tmp_path / "settle.yaml"
    rules.write_text(RULES)
    posted: list[dict] = []
    hooks = ThreadedApp(receiver(posted))
    stack = Stack.start(
        tmp_path / "stack",
        rules=[rules],
        hosts=["settle.things.test"],
        sidecar_args=["--notify", f"{hooks.__enter__()}/hooks/sidecar"],
    )
    try:
        slow = thing("gear", host="settle.things.test", path="/slow/things?delay=3")
        # Attempt 1: the API creates the thing but answers after timeout_s: unknown.
        (first,) = run_agent(stack, "312", "requests", [slow])
        assert first["status"] == 504
        # Attempt 2: no probe, no safe retry - refused for a human.
        (second,) = run_agent(stack, "312", "requests", [slow])
        assert second["status"] == 409
        assert second["body"]["code"] == "effect_unknown"
        assert "sidecar effects resolve 312" in second["body"]["detail"]

        # The operator checks the API, finds thing 1, and says so.
        done = resolve(
            stack, "--as", "completed", "--status", "201",
            "--body", '{"id": 1, "name": "gear"}', "--note", "thing 1 exists in the API",
            "--by", "alice@ops",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "resolved completed" in done.stdout

        # Attempt 3 is answered with that evidence; nothing is sent.
        agent = start_agent(stack, "312", "requests", [slow])
        agent.wait_for("^done$", timeout=90)
        assert agent.proc.wait(timeout=30) == 0
        (third,) = results(agent)
        assert third["status"] == 201
        assert third["x-sidecar-effect"] == "replayed"
        assert third["body"] == {"id": 1, "name": "gear"}
        assert stack.counts()["requests"] == {"POST /slow/things": 1}
        assert len(stack.things()) == 1

        # Settled once: a second resolution is refused.
        again = resolve(stack, "--as", "abandoned", "--note", "changed my mind")
        assert again.returncode == 1
        assert "not waiting for a human" in again.stderr

        deadline = time.monotonic() + 10
        while True:
            (effect,) = stack.effects("312")
            events = [e["event"] for e in effect["events"]]
            if "replayed" in events or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert effect["state"] == "completed"
        assert events.count("blocked") == 1
        resolved = next(e for e in effect["events"] if e["event"] == "resolved")
        assert "completed by alice@ops: thing 1 exists in the API" in resolved["detail"]
        assert events.index("blocked") < events.index("resolved") < events.index("replayed")

        # The operator was told, once, though the first post was refused (503, retried).
        deadline = time.monotonic() + 10
        while not posted and time.monotonic() < deadline:
            time.sleep(0.1)
        (blocked,) = [e for e in posted if e["event"] == "effect_blocked"]
        assert (blocked["task"], blocked["effect_key"]) == ("312", KEY)
        assert blocked["rule"] == "test.things.settled"
        assert "CANNOT DETERMINE" in blocked["detail"]
        metrics = stack.metrics()
        assert (
            'sidecar_notifications_total{event="effect_blocked",outcome="delivered"} 1.0' in metrics
        )
        assert 'sidecar_refusals_total{code="effect_unknown"} 1.0' in metrics
    finally:
        stack.close()
        hooks.__exit__(None, None, None)
