"""Secrets a rule marks, through the effect guard: a token in the URL is in no record, key,
audit line, log line or refusal; marked answer fields are stored redacted, so a replay
answers with the redacted value while the first answer is the real one."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import pytest

from sidecar.proxy.upstream import UpstreamError
from sidecar.runtime.clock import ManualClock
from tests.unit.proxy.test_guard import World, call, make_world, reply, request

RULES = """
rules:
  - name: bot.send
    match: {host: bot.test, method: POST, path: "/bot{token}/sendMessage"}
    effect: non_idempotent
    on_unknown: block
    redact: {params: [token]}
  - name: apps.create
    match: {host: apps.test, method: POST, path: /apps}
    effect: non_idempotent
    key: "app:{body.name}"
    redact: {response: [client_secret, credentials.password]}
"""
TOKEN = "123456:AAH-bot-token-only-for-tests"
SEND = f"/bot{TOKEN}/sendMessage"


@pytest.fixture
def world(tmp_path: Path, clock: ManualClock) -> World:
    return make_world(RULES, tmp_path, clock)


async def everything_kept(world: World, task: str) -> str:
    """The task's effects, audit lines and refusals, as one text."""
    store = world.store
    kept = [*await store.effects(task), *await store.effect_events(task)]
    kept += await store.refusals(task)
    return json.dumps([asdict(item) for item in kept], default=str)


async def test_a_token_in_the_path_is_sent_but_kept_and_logged_nowhere(world, caplog):
    caplog.set_level(logging.DEBUG)
    await world.store.claim("312", "a", 60)
    world.upstream.answers.append(
        UpstreamError(f"POST https://bot.test{SEND}: ServerDisconnectedError")
    )
    lost = await call(world, "312", request("bot.test", SEND, {"chat_id": 1, "text": "hi"}))
    assert json.loads(lost.body)["code"] == "upstream_failed"
    (effect,) = await world.store.effects("312")
    assert effect.key.startswith("bot.send:POST /bot[redacted:")
    assert effect.request["url"] == "https://bot.test/bot[redacted]/sendMessage"
    assert world.upstream.sent[0][1] == f"https://bot.test{SEND}"  # the real URL went out
    assert TOKEN not in await everything_kept(world, "312")
    assert TOKEN not in caplog.text
    assert TOKEN not in lost.body.decode()


async def test_two_tokens_are_two_effects(world):
    await world.store.claim("312", "a", 60)
    world.upstream.answers += [reply(200, {"ok": True}), reply(200, {"ok": True})]
    for token in ("1:first", "2:second"):
        sent = await call(world, "312", request("bot.test", f"/bot{token}/sendMessage", {}))
        assert sent.disposition == "recorded"
    assert len({e.key for e in await world.store.effects("312")}) == 2


async def test_marked_answer_fields_are_stored_redacted_and_replayed_redacted(world):
    await world.store.claim("312", "a", 60)
    created = {"client_id": "c1", "client_secret": "s3cr3t", "credentials": {"password": "pw"}}
    world.upstream.answers.append(reply(201, created))
    first = await call(world, "312", request("apps.test", "/apps", {"name": "ci"}))
    again = await call(world, "312", request("apps.test", "/apps", {"name": "ci"}))
    assert json.loads(first.body) == created
    assert (again.status, again.disposition) == (201, "replayed")
    assert json.loads(again.body) == {
        "client_id": "c1",
        "client_secret": "[redacted]",
        "credentials": {"password": "[redacted]"},
    }
    kept = await everything_kept(world, "312")
    assert "s3cr3t" not in kept
    assert '"pw"' not in kept
