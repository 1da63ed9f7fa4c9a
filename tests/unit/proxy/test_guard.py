"""The effect guard's decisions, with the memory store, a fake upstream and a manual clock."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from yarl import URL

from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.errors import StoreUnavailable
from sidecar.proxy.exchange import AgentRequest
from sidecar.proxy.guard import EffectGuard
from sidecar.proxy.redact import OFF_LOOP_BYTES
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.recording.bindings import Bindings
from sidecar.rules import RuleSet, canonical_body, load_rules
from sidecar.rules.facts import HttpRequestFacts
from sidecar.runtime.clock import ManualClock
from sidecar.runtime.metrics import Metrics
from sidecar.store.memory import MemoryStore
from tests.conftest import sequential_ids

RULES = """
rules:
  - name: things.create
    match: {host: api.test, method: POST, path: "/repos/{repo}/things"}
    effect: non_idempotent
    key: "{repo}:{body.name}"
    on_unknown: probe
    timeout_s: 0.05
    settle_s: 1
    probe:
      request: {path: "/repos/{repo}/things?name={body.name}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}
    checkpoint: {stage: THING_CREATED, outputs: {thing_id: id}}
  - name: charges.create
    match: {host: pay.test, method: POST, path: /charges}
    effect: non_idempotent
    key: "{body.order}"
    idempotency_header: Idempotency-Key
    on_unknown: retry
  - name: notes.post
    match: {host: notes.test, method: POST}
    effect: non_idempotent
  - name: model.ask
    match: {host: model.test, method: POST}
    effect: cache
  - name: pings.post
    match: {host: pings.test, method: POST}
    effect: non_idempotent
    on_unknown: retry
"""


@dataclass(frozen=True)
class Late:
    """An answer that comes ``after_s`` seconds late (servers keep working)."""

    reply: Reply
    after_s: float


@dataclass
class FakeUpstream:
    """Answers from a script; remembers every request it was sent."""

    answers: list[Reply | Late | Exception] = field(default_factory=list)
    sent: list[tuple[str, str, dict[str, str], bytes | None]] = field(default_factory=list)

    def url(self, scheme: str, host: str, port: int | None, path_and_query: str) -> URL:
        return URL.build(scheme=scheme, host=host, port=port).join(
            URL(path_and_query, encoded=True)
        )

    async def send(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
    ) -> Reply:
        self.sent.append((method, str(url), dict(headers), body))
        answer = self.answers.pop(0)
        if isinstance(answer, Late):
            await asyncio.sleep(answer.after_s)
            answer = answer.reply
        if isinstance(answer, Exception):
            raise answer
        return answer


def reply(status: int, body: object) -> Reply:
    return Reply(status, (("Content-Type", "application/json"),), json.dumps(body).encode())


@dataclass
class World:
    store: MemoryStore
    bindings: Bindings
    upstream: FakeUpstream
    guard: EffectGuard
    rules: RuleSet


@pytest.fixture
def world(tmp_path: Path, clock: ManualClock) -> World:
    return make_world(RULES, tmp_path, clock)


def make_world(rules_text: str, tmp_path: Path, clock: ManualClock) -> World:
    """A guard over a memory store, a fake upstream and the rules in ``rules_text``."""
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(rules_text)
    store = MemoryStore(clock=clock, new_attempt_id=sequential_ids())
    bindings = Bindings(store, clock, margin_s=2)
    store.observer = bindings
    upstream = FakeUpstream()
    rules = load_rules([rules_file])
    guard = EffectGuard(store, bindings, upstream, clock, Metrics(), store_retry_s=0.1)
    return World(store, bindings, upstream, guard, rules)


def request(host: str, path: str, body: dict) -> AgentRequest:
    raw = json.dumps(body).encode()
    headers = (("Content-Type", "application/json"), ("Authorization", "Bearer t0ken"))
    facts = HttpRequestFacts.from_target("POST", host, None, path, headers, raw)
    return AgentRequest(facts, "https", path, headers)


async def call(world: World, task: str, req: AgentRequest):
    match = world.rules.match(req.facts)
    binding = await world.bindings.for_task(task, "default")
    return await world.guard.handle(binding, match, req)


async def test_first_try_records_forwards_and_writes_the_rules_checkpoint(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(reply(201, {"id": 7, "name": "gear"}))
    answer = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert (answer.status, answer.disposition) == (201, "recorded")
    effect = await store.effect("312", "app:gear")
    assert effect.state is EffectState.COMPLETED
    assert [(c.stage, c.outputs) for c in await store.checkpoints("312")] == [
        ("THING_CREATED", {"thing_id": 7})
    ]
    assert upstream.sent[0][2]["Authorization"] == "Bearer t0ken"


async def test_a_lease_about_to_expire_holds_writes_back(world, clock):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 10)
    clock.advance(8.5)  # margin is min(2 s, ttl/4 = 2.5 s)
    answer = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert answer.status == 503
    assert json.loads(answer.body)["code"] == "lease_expiring"
    assert upstream.sent == []
    assert await store.effect("312", "app:gear") is None


async def test_a_heartbeat_seen_in_the_store_lifts_self_fencing(world, clock):
    store, upstream = world.store, world.upstream
    claim = await store.claim("312", "a", 10)
    clock.advance(8.5)
    await store.heartbeat("312", claim.attempt_id, claim.generation)
    upstream.answers.append(reply(201, {"id": 1}))
    answer = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert answer.disposition == "recorded"


async def test_an_unknown_effect_is_probed_after_settling_and_found(world, clock):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(UpstreamError("reset"))
    lost = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert (lost.status, json.loads(lost.body)["code"]) == (502, "upstream_failed")
    assert (await store.effect("312", "app:gear")).state is EffectState.UNKNOWN
    clock.advance(1)
    upstream.answers.append(reply(200, [{"id": 9, "name": "gear"}]))
    found = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert (found.status, found.disposition) == (201, "probed")
    assert json.loads(found.body) == {"id": 9, "name": "gear"}
    assert upstream.sent[-1][0:2] == ("GET", "https://api.test/repos/app/things?name=gear")


async def test_an_unknown_effect_not_found_by_the_probe_is_sent_once_more(world, clock):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers += [reply(503, {"m": "busy"}), reply(200, []), reply(201, {"id": 2})]
    await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    clock.advance(1.5)  # the first try ended with its 503, and settle_s has passed
    again = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert (again.status, again.disposition) == (201, "recorded")
    assert [m for m, *_ in upstream.sent] == ["POST", "GET", "POST"]


async def test_an_older_attempts_effect_not_found_is_not_sent_again_before_it_settles(world, clock):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(UpstreamError("reset"))
    await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    # Worker a's lease runs for another 60 s; worker b took over (same worker name
    # restarted), so a's requests could land until its lease_until + timeout, and the
    # API may act settle_s after that: "not found" before then proves nothing.
    await store.claim("312", "a", 60)
    upstream.answers.append(reply(200, []))
    refused = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert refused.status == 503
    assert json.loads(refused.body)["code"] == "effect_settling"
    assert dict(refused.headers)["Retry-After"] == "61"
    assert [m for m, *_ in upstream.sent] == ["POST", "GET"]  # probed, not sent again


async def test_retry_resends_with_the_idempotency_key_of_the_first_attempt(world, clock):
    store, upstream = world.store, world.upstream
    first = await store.claim("312", "a", 60)
    upstream.answers.append(UpstreamError("timeout", timeout=True))
    lost = await call(world, "312", request("pay.test", "/charges", {"order": "o-1"}))
    assert lost.status == 504
    await store.release("312", first.attempt_id, first.generation)
    await store.claim("312", "b", 60)
    upstream.answers.append(reply(201, {"id": "ch_1"}))
    again = await call(world, "312", request("pay.test", "/charges", {"order": "o-1"}))
    assert again.disposition == "recorded"
    keys = [headers["Idempotency-Key"] for _, _, headers, _ in upstream.sent]
    assert keys[0] == keys[1]
    assert keys[0].startswith(first.attempt_id)


async def test_a_failed_effect_is_sent_again(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers += [reply(422, {"message": "invalid"}), reply(201, {"id": 1})]
    failed = await call(world, "312", request("notes.test", "/notes", {"text": "hi"}))
    assert failed.status == 422
    again = await call(world, "312", request("notes.test", "/notes", {"text": "hi"}))
    assert again.status == 201
    assert len(upstream.sent) == 2


async def test_an_unknown_effect_without_probe_or_retry_is_blocked(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(reply(500, {}))
    await call(world, "312", request("notes.test", "/notes", {"text": "hi"}))
    blocked = await call(world, "312", request("notes.test", "/notes", {"text": "hi"}))
    assert blocked.status == 409
    assert json.loads(blocked.body)["code"] == "effect_unknown"
    assert len(upstream.sent) == 1


async def test_cache_rules_answer_only_successes_from_the_log(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers += [reply(429, {}), reply(200, {"text": "patch"})]
    ask = request("model.test", "/v1/messages", {"prompt": "x"})
    assert (await call(world, "312", ask)).status == 429
    assert (await call(world, "312", ask)).disposition == "recorded"
    replayed = await call(world, "312", ask)
    assert replayed.disposition == "replayed"
    assert json.loads(replayed.body) == {"text": "patch"}
    assert len(upstream.sent) == 2


async def test_an_unavailable_store_fails_closed(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)

    async def down(*args, **kwargs):
        raise StoreUnavailable("disk gone")

    store.record_pending = down  # type: ignore[method-assign]
    answer = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert answer.status == 503
    assert json.loads(answer.body)["code"] == "store_unavailable"
    assert upstream.sent == []


async def test_a_body_over_the_rules_limit_is_refused(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    big = request("api.test", "/repos/app/things", {"name": "x" * (2 << 20)})
    answer = await call(world, "312", big)
    assert answer.status == 413
    assert upstream.sent == []


async def test_replays_come_from_memory_and_are_audited_once_per_attempt(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(reply(201, {"id": 1}))
    charge = request("pay.test", "/charges", {"order": "o-1"})
    await call(world, "312", charge)
    answers = [await call(world, "312", charge) for _ in range(5)]
    assert {a.disposition for a in answers} == {"replayed"}
    assert dict(answers[0].headers)["Idempotent-Replayed"] == "true"
    assert len(upstream.sent) == 1
    await asyncio.sleep(0)  # let the background audit line land
    events = [e.event for e in await store.effect_events("312")]
    assert events == ["pending", "completed", "replayed"]


async def test_an_effect_an_older_sidecar_fingerprinted_is_replayed_unflagged_for_its_payload(
    world,
):
    """Fingerprints recorded before version 2 (``sha256:`` over ``json.dumps``'s canonical
    body) are compared in their own version: upgrading the sidecar mid-task does not turn
    the agent's retry into a divergent replay."""
    store, upstream = world.store, world.upstream
    claim = await store.claim("312", "a", 60)
    charge = request("pay.test", "/charges", {"order": "o-1", "amount": 5})
    digest = hashlib.sha256(b"POST\n/charges\n\n" + canonical_body(charge.facts))
    await store.record_pending(
        "312",
        "o-1",
        claim.attempt_id,
        claim.generation,
        kind="http",
        rule="charges.create",
        fingerprint="sha256:" + digest.hexdigest(),
        idempotency_key=None,
        request={},
    )
    await store.transition_effect(
        "312",
        "o-1",
        claim.attempt_id,
        claim.generation,
        EffectState.COMPLETED,
        response=RecordedResponse(201, (), b'{"id": 1}'),
    )
    same = await call(world, "312", request("pay.test", "/charges", {"amount": 5, "order": "o-1"}))
    assert same.disposition == "replayed"
    assert "X-Sidecar-Divergent" not in dict(same.headers)
    other = await call(world, "312", request("pay.test", "/charges", {"order": "o-1", "amount": 6}))
    assert dict(other.headers)["X-Sidecar-Divergent"] == "true"
    assert upstream.sent == []


async def test_an_effect_that_never_reached_the_upstream_is_failed_and_simply_sent_again(world):
    """Connection refused, name not resolved, TLS certificate not trusted: the connector
    failed before a byte was written, so nothing needs probing or a human."""
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(UpstreamError("connect: certificate verify failed", sent=False))
    lost = await call(world, "312", request("notes.test", "/notes", {"text": "hi"}))
    assert (lost.status, json.loads(lost.body)["code"]) == (502, "upstream_failed")
    assert "nothing was sent" in json.loads(lost.body)["detail"]
    (effect,) = await store.effects("312")
    assert effect.state is EffectState.FAILED
    upstream.answers.append(reply(201, {"id": 1}))
    again = await call(world, "312", request("notes.test", "/notes", {"text": "hi"}))
    assert (again.status, again.disposition) == (201, "recorded")
    assert len(upstream.sent) == 2


async def test_an_unexpected_exception_is_answered_and_the_effect_stays_pending(world):
    """SPEC §3.6: a bug in the effect path ends in the sidecar's own 500, never in a
    request handed back to the proxy engine; what was recorded first stays pending, which
    the next attempt treats as unknown (retry with the first idempotency key)."""
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(ValueError("Forbidden control character"))
    charge = request("pay.test", "/charges", {"order": "o-9"})
    broken = await call(world, "312", charge)
    assert (broken.status, broken.disposition) == (500, "refused")
    problem = json.loads(broken.body)
    assert problem["code"] == "sidecar_error"
    assert "ValueError" in problem["detail"]
    (effect,) = await store.effects("312")
    assert effect.state is EffectState.PENDING
    first_key = upstream.sent[0][2]["Idempotency-Key"]

    upstream.answers.append(reply(201, {"id": 9}))
    again = await call(world, "312", charge)
    assert (again.status, again.disposition) == (201, "recorded")
    assert upstream.sent[1][2]["Idempotency-Key"] == first_key


async def test_a_key_the_store_cannot_hold_is_refused_before_anything_is_recorded(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    lone = AgentRequest(
        HttpRequestFacts.from_target(
            "POST", "api.test", None, "/repos/app/things", (), b'{"name": "\\udc00"}'
        ),
        "https",
        "/repos/app/things",
        (),
    )
    answer = await call(world, "312", lone)
    assert (answer.status, json.loads(answer.body)["code"]) == (400, "invalid_request")
    assert "lone surrogate" in json.loads(answer.body)["detail"]
    assert upstream.sent == []
    assert await store.effects("312") == []


async def test_a_body_the_store_cannot_hold_is_summarised_with_it_replaced(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(reply(201, {"id": 1}))
    raw = b'{"order": "o-1", "note": "\\udc00"}'
    facts = HttpRequestFacts.from_target("POST", "pay.test", None, "/charges", (), raw)
    answer = await call(world, "312", AgentRequest(facts, "https", "/charges", ()))
    assert answer.disposition == "recorded"
    assert upstream.sent[0][3] == raw, "the body goes upstream exactly as sent"
    (effect,) = await store.effects("312")
    assert effect.request["body"]["note"] == "\ufffd"


async def test_a_late_answer_is_recorded_and_the_retry_gets_it_instead_of_a_second_send(world):
    """SPEC §3.8: the agent is told 504 at timeout_s; the first try's connection is kept,
    and the retry waits for its answer instead of probing (too early) and sending again."""
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(Late(reply(201, {"id": 5, "name": "gear"}), after_s=0.3))
    late = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert (late.status, json.loads(late.body)["code"]) == (504, "upstream_failed")
    again = await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    assert (again.status, again.disposition) == (201, "replayed")
    assert json.loads(again.body) == {"id": 5, "name": "gear"}
    assert [m for m, *_ in upstream.sent] == ["POST"]
    effect = await store.effect("312", "app:gear")
    assert effect.state is EffectState.COMPLETED
    assert "after the agent was told the request timed out" in effect.detail


async def test_the_audit_line_of_a_resend_says_why_it_was_safe(world, clock):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers += [reply(503, {"m": "busy"}), reply(200, []), reply(201, {"id": 2})]
    await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    clock.advance(1.5)
    await call(world, "312", request("api.test", "/repos/app/things", {"name": "gear"}))
    details = [e.detail for e in await store.effect_events("312") if e.event == "pending"]
    assert details[-1] == "sent again: the probe proved it absent after the first try settled"
    assert not any("idempotency key" in (d or "") for d in details)


async def test_the_audit_line_of_a_declared_safe_retry_says_so(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers += [UpstreamError("reset"), reply(201, {"id": 3})]
    note = request("pings.test", "/pings", {"text": "hi"})
    await call(world, "312", note)
    again = await call(world, "312", note)
    assert again.disposition == "recorded"
    details = [e.detail for e in await store.effect_events("312") if e.event == "pending"]
    assert details[-1] == "sent again: the rule declares a retry safe (on_unknown: retry)"


async def test_a_large_body_is_hashed_off_the_loop_and_its_summary_has_its_digest(world):
    store, upstream = world.store, world.upstream
    await store.claim("312", "a", 60)
    upstream.answers.append(reply(201, {"id": 1}))
    req = request("pay.test", "/charges", {"order": "o-big", "pad": "x" * 300_000})
    assert len(req.body) >= OFF_LOOP_BYTES
    answer = await call(world, "312", req)
    assert answer.disposition == "recorded"
    (effect,) = await store.effects("312")
    assert effect.request["body_sha256"] == hashlib.sha256(req.body).hexdigest()
    assert effect.request["body_bytes"] == len(req.body)
