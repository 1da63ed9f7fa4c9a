"""The checklist over the in-memory store, probing through a fake upstream."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
from yarl import URL

from sidecar.domain.model import EffectState
from sidecar.errors import NotFound
from sidecar.proxy.redact import request_summary
from sidecar.proxy.upstream import Reply
from sidecar.resume.checklist import run_checklist
from sidecar.resume.model import Found, Next, Verdict
from sidecar.resume.probing import Prober, rebuild_request
from sidecar.rules import RuleSet
from sidecar.rules.model import Rule
from sidecar.runtime.clock import ManualClock
from sidecar.store.memory import MemoryStore

RULE = Rule.model_validate(
    {
        "name": "things.create",
        "match": {"host": "api.test", "method": "POST", "path": "/repos/{owner}/things"},
        "effect": "non_idempotent",
        "key": "{owner}#thing:{body.name}",
        "on_unknown": "probe",
        "timeout_s": 1,
        "settle_s": 1,
        "probe": {
            "request": {"method": "GET", "path": "/repos/{owner}/things?name={body.name}"},
            "found": "length(@) > `0`",
            "answer": {"status": 201, "body": "[0]"},
        },
    }
)
RULES = RuleSet([RULE])


class Upstream:
    """Answers every probe with ``things``; remembers what it was asked."""

    def __init__(self, things: list[dict[str, Any]]) -> None:
        self.things = things
        self.asked: list[tuple[str, dict[str, str]]] = []

    def url(self, scheme: str, host: str, port: int | None, path_and_query: str) -> URL:
        return URL.build(scheme="http", host="upstream.test").join(URL(path_and_query))

    async def send(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
    ) -> Reply:
        self.asked.append((f"{method} {url}", dict(headers)))
        return Reply(200, (), json.dumps(self.things).encode())


async def unknown_effect(store: MemoryStore, clock: ManualClock, name: str = "gear") -> str:
    claim = await store.claim("312", "worker-a", 5)
    summary = request_summary(
        "POST", "https", "api.test", "/repos/acme/things", "",
        [("Authorization", "Bearer secret"), ("X-Team", "blue")],
        json.dumps({"name": name}).encode(),
    )  # fmt: skip
    key = f"acme#thing:{name}"
    await store.record_pending(
        "312", key, claim.attempt_id, claim.generation, kind="http", rule=RULE.name,
        fingerprint="sha256:x", idempotency_key=None, request=summary,
    )  # fmt: skip
    await store.transition_effect(
        "312", key, claim.attempt_id, claim.generation, EffectState.UNKNOWN, detail="500"
    )
    await store.release("312", claim.attempt_id, claim.generation)
    return key


async def test_a_found_effect_is_replayed_and_nothing_is_written(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    key = await unknown_effect(store, clock)
    upstream = Upstream([{"name": "gear"}])
    prober = Prober(RULES, upstream, [("Authorization", "Bearer operator")])
    report = await run_checklist(store, "312", rules=RULES, prober=prober, clock=clock)
    assert (report.verdict, report.exit_code) == (Verdict.SAFE, 0)
    (check,) = report.effects
    assert (check.key, check.found, check.next) == (key, Found.FOUND, Next.REPLAY)
    ((asked, headers),) = upstream.asked
    assert asked == "GET http://upstream.test/repos/acme/things?name=gear"
    # The operator's credentials, not the redacted ones; the agent's other headers kept.
    assert headers["Authorization"] == "Bearer operator"
    assert headers["x-team"] == "blue"
    assert (await store.effect("312", key)).state is EffectState.UNKNOWN  # type: ignore[union-attr]


async def test_not_found_waits_until_the_first_try_cannot_land(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    await unknown_effect(store, clock)
    prober = Prober(RULES, Upstream([]))
    early = await run_checklist(store, "312", rules=RULES, prober=prober, clock=clock)
    assert (early.effects[0].found, early.exit_code) == (Found.WAIT, 3)
    clock.advance(60)
    late = await run_checklist(store, "312", rules=RULES, prober=prober, clock=clock)
    assert (late.effects[0].found, late.effects[0].next, late.exit_code) == (
        Found.NOT_FOUND, Next.SEND, 0,
    )  # fmt: skip


async def test_a_live_lease_is_exit_4_and_nothing_is_probed(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    await unknown_effect(store, clock)
    await store.claim("312", "worker-b", 30)
    upstream = Upstream([{"name": "gear"}])
    report = await run_checklist(
        store, "312", rules=RULES, prober=Prober(RULES, upstream), clock=clock
    )
    assert (report.verdict, report.exit_code) == (Verdict.LEASE_HELD, 4)
    assert upstream.asked == []
    assert "HELD by" in report.steps[0].evidence[0]
    assert "next claim gets generation 3" in report.steps[5].evidence[0]


async def test_an_unknown_task_is_not_found(clock: ManualClock) -> None:
    with pytest.raises(NotFound):
        await run_checklist(MemoryStore(clock=clock), "9", rules=RULES, prober=None, clock=clock)


async def test_a_probe_that_would_carry_a_redacted_value_is_not_sent(clock: ManualClock) -> None:
    store = MemoryStore(clock=clock)
    await unknown_effect(store, clock, name="token-[redacted]")
    upstream = Upstream([])
    report = await run_checklist(
        store, "312", rules=RULES, prober=Prober(RULES, upstream), clock=clock
    )
    assert (report.effects[0].found, report.exit_code) == (Found.CANNOT_PROBE, 3)
    assert upstream.asked == []


def test_a_rebuilt_request_drops_redacted_headers_and_takes_the_operators() -> None:
    summary = request_summary(
        "POST", "https", "api.test:8443", "/repos/acme/things", "a=1",
        [("Authorization", "Bearer x"), ("X-Team", "blue")], b'{"name": "gear"}',
    )  # fmt: skip
    request = rebuild_request(summary, [("X-Team", "red")])
    assert request.facts.host == "api.test"
    assert request.facts.port == 8443
    assert request.target == "/repos/acme/things?a=1"
    assert dict(request.headers) == {"X-Team": "red"}
    assert request.facts.json_body() == {"name": "gear"}
