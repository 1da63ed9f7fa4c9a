"""The protocol parts of the effect guard: how an HTTP API call and a ``git push`` are
named, replayed, judged and probed (``sidecar.proxy.codecs``).

Rules are loaded from YAML as operators write them; probes go to a scripted upstream that
keeps what it was sent."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from yarl import URL

from sidecar.domain.model import Effect, EffectState, RecordedResponse
from sidecar.errors import InvalidRequest, ProbeFailed
from sidecar.proxy import git
from sidecar.proxy.codecs import Described, GitPushCodec, HttpCodec, codec_for
from sidecar.proxy.exchange import AgentRequest
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.rules import RuleMatch, RuleSet, load_rules
from sidecar.rules.facts import HttpRequestFacts
from sidecar.rules.model import Rule

RULES = """
rules:
  - name: things.create
    match: {host: api.test, method: POST, path: "/repos/{repo}/things"}
    effect: non_idempotent
    key: "{repo}:{body.name}"
    idempotency_header: Idempotency-Key
    on_unknown: probe
    probe:
      request:
        path: "/repos/{repo}/things?name={body.name}"
        headers: {X-Probe: "{repo}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}
    exists_when: {status: [422], found: "message == 'already exists'"}
  - name: things.unprobed
    match: {host: api.test, method: POST, path: "/plain"}
    effect: non_idempotent
  - name: model.ask
    match: {host: model.test, method: POST}
    effect: cache
  - name: git.push
    match: {host: git.test, method: POST, path: "/{owner}/{repo}/git-receive-pack"}
    effect: non_idempotent
    protocol: git-receive-pack
    key: "{owner}/{repo}"
    on_unknown: probe
    on_divergence: reject
  - name: git.push.unkeyed
    match: {host: other.test, method: POST}
    effect: non_idempotent
    protocol: git-receive-pack
"""
AT = datetime(2026, 1, 1, 14, 0, tzinfo=UTC)
OLD, NEW, OTHER = "1" * 40, "2" * 40, "3" * 40


@dataclass
class Upstream:
    """Answers probes from a script and keeps what it was sent."""

    answers: list[Reply | Exception] = field(default_factory=list)
    sent: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

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
        self.sent.append((method, str(url), dict(headers)))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return load_rules([path])


def request(host: str, path: str, body: bytes, *extra: tuple[str, str]) -> AgentRequest:
    headers = (("Content-Type", "application/json"), ("Authorization", "Bearer t0ken"), *extra)
    facts = HttpRequestFacts.from_target("POST", host, None, path, headers, body)
    return AgentRequest(facts, "https", path, headers)


def thing(name: str, *extra: tuple[str, str]) -> AgentRequest:
    return request("api.test", "/repos/app/things", json.dumps({"name": name}).encode(), *extra)


def matched(rules: RuleSet, agent: AgentRequest) -> RuleMatch:
    match = rules.match(agent.facts)
    assert match is not None
    return match


def rule_named(rules: RuleSet, name: str) -> Rule:
    rule = rules.get(name)
    assert rule is not None
    return rule


def json_reply(status: int, body: object) -> Reply:
    return Reply(status, (("Content-Type", "application/json"),), json.dumps(body).encode())


def effect(response: RecordedResponse | None = None, request_json: object = None) -> Effect:
    return Effect(
        "312", "k", EffectState.COMPLETED, "http", "r", "att-0001", "att-0001", 1,
        "sha256:x", None, request_json or {}, AT, AT, response,
    )  # fmt: skip


# ---- request/response APIs -----------------------------------------------------------


def test_an_http_effect_is_named_by_its_rules_key_and_told_apart_by_its_payload(rules):
    codec = HttpCodec()
    gear = codec.describe(matched(rules, thing("gear")), thing("gear"))
    again = codec.describe(matched(rules, thing("gear")), thing("gear"))
    other = request("api.test", "/repos/app/things", b'{"name": "gear", "size": 2}')
    changed = codec.describe(matched(rules, other), other)
    assert gear.key == "app:gear"
    assert gear == again
    assert changed.key == gear.key
    assert changed.fingerprint != gear.fingerprint


def test_a_completed_http_effect_is_replayed_exactly_as_recorded(rules):
    recorded = RecordedResponse(201, (("Content-Type", "application/json"), ("X-Id", "7")), b"{}")
    codec = HttpCodec()
    content = codec.replay(effect(recorded), Described("app:gear", "sha256:x"))
    assert (content.status, content.headers, content.body) == (201, recorded.headers, b"{}")
    assert codec.reject(effect(recorded), Described("app:gear", "sha256:x")) is None


@pytest.mark.parametrize(
    ("rule", "status", "state"),
    [
        ("things.create", 201, EffectState.COMPLETED),
        ("things.create", 302, EffectState.COMPLETED),
        ("things.create", 422, EffectState.FAILED),
        ("things.create", 500, EffectState.UNKNOWN),
        ("things.create", 503, EffectState.UNKNOWN),
        ("model.ask", 200, EffectState.COMPLETED),
        ("model.ask", 302, EffectState.FAILED),
        ("model.ask", 503, EffectState.FAILED),
    ],
)
def test_an_http_answer_decides_the_effects_state(rules, rule, status, state):
    assert HttpCodec().classify(rule_named(rules, rule), Reply(status, (), b"")) is state


def test_an_already_exists_answer_is_recognised_only_by_its_status_and_body(rules):
    codec = HttpCodec()
    rule = rule_named(rules, "things.create")
    assert codec.already_exists(rule, json_reply(422, {"message": "already exists"}))
    assert not codec.already_exists(rule, json_reply(422, {"message": "name too long"}))
    assert not codec.already_exists(rule, json_reply(409, {"message": "already exists"}))
    assert not codec.already_exists(rule, Reply(422, (), b"<html>already exists</html>"))
    assert not codec.already_exists(rule_named(rules, "things.unprobed"), json_reply(422, {}))


async def test_a_probe_asks_with_the_agents_credentials_and_answers_what_it_found(rules):
    upstream = Upstream([json_reply(200, [{"id": 7, "name": "gear"}, {"id": 8}])])
    agent = thing("gear", ("Idempotency-Key", "idem-1"), ("Content-Encoding", "gzip"))
    found = await HttpCodec().probe(
        upstream, matched(rules, agent), agent, effect(), Described("app:gear", "sha256:x")
    )
    assert found == RecordedResponse(
        201, (("Content-Type", "application/json"),), json.dumps({"id": 7, "name": "gear"}).encode()
    )
    ((method, url, headers),) = upstream.sent
    assert (method, url) == ("GET", "https://api.test/repos/app/things?name=gear")
    assert headers == {"Authorization": "Bearer t0ken", "x-probe": "app"}, (
        "credentials go along; body headers and the idempotency key do not"
    )


@pytest.mark.parametrize("answer", [json_reply(200, []), json_reply(404, {"message": "Not Found"})])
async def test_a_probe_that_finds_nothing_says_the_effect_did_not_happen(rules, answer):
    agent = thing("gear")
    found = await HttpCodec().probe(
        Upstream([answer]), matched(rules, agent), agent, effect(), Described("app:gear", "x")
    )
    assert found is None


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (json_reply(500, {}), "answered 500"),
        (Reply(200, (), b"<html>"), "did not answer JSON"),
        (UpstreamError("connection reset"), "failed: connection reset"),
    ],
)
async def test_a_probe_that_cannot_tell_fails_rather_than_guess(rules, answer, why):
    agent = thing("gear")
    with pytest.raises(ProbeFailed, match=why):
        await HttpCodec().probe(
            Upstream([answer]), matched(rules, agent), agent, effect(), Described("app:gear", "x")
        )


async def test_a_rule_without_a_probe_or_the_values_it_needs_cannot_be_probed(rules):
    plain = request("api.test", "/plain", b"{}")
    with pytest.raises(ProbeFailed, match="has no probe"):
        await HttpCodec().probe(
            Upstream(), matched(rules, plain), plain, effect(), Described("k", "x")
        )
    nameless = request("api.test", "/repos/app/things", b"{}")
    upstream = Upstream()
    with pytest.raises(ProbeFailed, match="cannot build the probe"):
        await HttpCodec().probe(
            upstream, matched(rules, nameless), nameless, effect(), Described("k", "x")
        )
    assert upstream.sent == [], "no half-built probe is sent"


# ---- git push over smart HTTP --------------------------------------------------------


def push_body(*updates: tuple[str, str, str], caps: str = "report-status") -> bytes:
    """A receive-pack request for ``updates`` (old, new, ref), with no pack."""
    lines = [f"{old} {new} {ref}" for old, new, ref in updates]
    lines[0] += f"\0 {caps}"
    return b"".join(git.pkt(f"{line}\n".encode()) for line in lines) + git.FLUSH


def push(
    path: str, *updates: tuple[str, str, str], host: str = "git.test", caps: str = "report-status"
):
    return request(host, path, push_body(*updates, caps=caps))


def test_a_push_is_named_by_repository_and_refs_whatever_the_order_or_git_suffix(rules):
    codec = GitPushCodec()
    one = push("/acme/app/git-receive-pack", (OLD, NEW, "refs/heads/b"), (OLD, NEW, "refs/heads/a"))
    two = push(
        "/acme/app.git/git-receive-pack", (OLD, NEW, "refs/heads/a"), (OLD, NEW, "refs/heads/b")
    )
    first = codec.describe(matched(rules, one), one)
    second = codec.describe(matched(rules, two), two)
    assert first.key == second.key == "acme/app@refs/heads/a,refs/heads/b"
    assert first.fingerprint == second.fingerprint
    assert first.summary["git"]["updates"][0] == {
        "ref": "refs/heads/b", "old": OLD, "new": NEW, "tree": None, "parents": None,
    }  # fmt: skip


def test_a_push_of_another_commit_to_the_same_ref_is_the_same_effect_with_another_payload(rules):
    codec = GitPushCodec()
    one = push("/acme/app/git-receive-pack", (OLD, NEW, "refs/heads/a"))
    two = push("/acme/app/git-receive-pack", (OLD, OTHER, "refs/heads/a"))
    first, second = (
        codec.describe(matched(rules, one), one),
        codec.describe(matched(rules, two), two),
    )
    assert first.key == second.key
    assert first.fingerprint != second.fingerprint


def test_without_a_key_a_push_is_named_by_host_and_repository_path(rules):
    agent = push(
        "/team/tool.git/git-receive-pack", (OLD, NEW, "refs/heads/main"), host="other.test"
    )
    described = GitPushCodec().describe(matched(rules, agent), agent)
    assert described.key == "other.test/team/tool@refs/heads/main"


def test_a_body_that_is_not_a_push_is_an_invalid_request(rules):
    agent = request("git.test", "/acme/app/git-receive-pack", b"hello")
    with pytest.raises(InvalidRequest, match="not a git push"):
        GitPushCodec().describe(matched(rules, agent), agent)


@pytest.mark.parametrize("caps", ["report-status", "report-status side-band-64k", "side-band"])
def test_a_repeated_push_is_answered_ok_for_every_ref_in_the_clients_own_shape(rules, caps):
    codec = GitPushCodec()
    agent = push(
        "/acme/app/git-receive-pack",
        (OLD, NEW, "refs/heads/a"),
        (OLD, NEW, "refs/tags/v1"),
        caps=caps,
    )
    described = codec.describe(matched(rules, agent), agent)
    content = codec.replay(effect(), described)
    assert content.status == 200
    assert dict(content.headers)["Content-Type"] == "application/x-git-receive-pack-result"
    assert git.read_report(content.body) == {"refs/heads/a": None, "refs/tags/v1": None}
    if "side-band" in caps:
        assert b"already pushed by attempt att-0001" in content.body, "git prints the note"


def test_a_push_of_a_different_tree_is_refused_for_every_ref_with_a_reason_git_prints(rules):
    codec = GitPushCodec()
    agent = push(
        "/acme/app/git-receive-pack", (OLD, NEW, "refs/heads/a"), caps="report-status side-band-64k"
    )
    content = codec.reject(effect(), codec.describe(matched(rules, agent), agent))
    assert content is not None
    assert git.read_report(content.body) == {
        "refs/heads/a": "effect-sidecar: this task already pushed a different tree here"
    }
    assert b"refusing to overwrite it" in content.body


def report(*lines: str) -> bytes:
    return b"".join(git.pkt(f"{line}\n".encode()) for line in lines) + git.FLUSH


@pytest.mark.parametrize(
    ("reply", "state"),
    [
        (Reply(200, (), report("unpack ok", "ok refs/heads/a")), EffectState.COMPLETED),
        (
            Reply(200, (), report("unpack ok", "ng refs/heads/a non-fast-forward")),
            EffectState.FAILED,
        ),
        (Reply(200, (), report("unpack index-pack failed", "ok refs/heads/a")), EffectState.FAILED),
        (Reply(200, (), b"garbage"), EffectState.UNKNOWN),
        (Reply(403, (), b""), EffectState.FAILED),
        (Reply(502, (), b""), EffectState.UNKNOWN),
    ],
)
def test_a_push_answer_decides_the_effects_state(rules, reply, state):
    codec = GitPushCodec()
    assert codec.classify(rule_named(rules, "git.push"), reply) is state
    assert not codec.already_exists(rule_named(rules, "git.push"), reply)


def advertisement(refs: dict[str, str]) -> bytes:
    head = git.pkt(b"# service=git-upload-pack\n") + git.FLUSH
    lines = [f"{sha} {ref}" for ref, sha in refs.items()]
    lines[0] += "\0multi_ack"
    return head + b"".join(git.pkt(f"{line}\n".encode()) for line in lines) + git.FLUSH


async def probe_push(rules, advertised: Reply | Exception, *updates: tuple[str, str, str]):
    agent = push("/acme/app.git/git-receive-pack", *updates)
    codec = GitPushCodec()
    described = codec.describe(matched(rules, agent), agent)
    upstream = Upstream([advertised])
    earlier = effect(request_json=described.summary)
    found = await codec.probe(upstream, matched(rules, agent), agent, earlier, described)
    return found, upstream


async def test_a_push_is_found_when_the_remote_advertises_every_ref_at_the_pushed_commit(rules):
    refs = {"refs/heads/main": OLD, "refs/heads/a": NEW}
    found, upstream = await probe_push(
        rules, Reply(200, (), advertisement(refs)), (OLD, NEW, "refs/heads/a"),
        (NEW, git.ZERO_SHA, "refs/heads/gone"),
    )  # fmt: skip
    assert found is not None
    assert found.status == 200
    assert git.read_report(found.body) == {"refs/heads/a": None, "refs/heads/gone": None}
    ((method, url, headers),) = upstream.sent
    assert (method, url) == (
        "GET",
        "https://git.test/acme/app.git/info/refs?service=git-upload-pack",
    )
    assert headers["Authorization"] == "Bearer t0ken"


async def test_a_push_is_not_found_while_a_ref_points_elsewhere(rules):
    refs = {"refs/heads/a": OTHER}
    found, _ = await probe_push(
        rules, Reply(200, (), advertisement(refs)), (OLD, NEW, "refs/heads/a")
    )
    assert found is None


@pytest.mark.parametrize(
    ("advertised", "why"),
    [
        (Reply(401, (), b""), "answered 401"),
        (Reply(200, (), b"zzzz"), "git probe"),
        (UpstreamError("timed out"), "failed: timed out"),
    ],
)
async def test_a_push_probe_that_cannot_tell_fails_rather_than_guess(rules, advertised, why):
    with pytest.raises(ProbeFailed, match=why):
        await probe_push(rules, advertised, (OLD, NEW, "refs/heads/a"))


def test_the_codec_is_chosen_by_the_rules_protocol(rules):
    http, push_codec = HttpCodec(), GitPushCodec()
    assert codec_for(rule_named(rules, "git.push"), http, push_codec) is push_codec
    assert codec_for(rule_named(rules, "things.create"), http, push_codec) is http
    assert codec_for(rule_named(rules, "model.ask"), http, push_codec) is http
