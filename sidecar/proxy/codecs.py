"""What differs between kinds of effect: how one is named, replayed, judged and probed.

The effect guard runs one flow for every matched request; a codec supplies the parts
that depend on the protocol the rule names:

* :class:`HttpCodec` - request/response APIs: the rule's key template, the recorded
  response replayed as is, the rule's probe request and JMESPath checks;
* :class:`GitPushCodec` - ``git push`` over smart HTTP: keyed by repository and refs,
  fingerprinted by tree and parents (a re-created commit has a new sha but the same
  tree), answered with a report-status shaped for the client that is asking, probed
  through the repository's advertised refs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from yarl import URL

from sidecar.domain.model import Effect, EffectState, RecordedResponse
from sidecar.errors import InvalidRequest, ProbeFailed
from sidecar.proxy import git
from sidecar.proxy.exchange import AgentRequest, Headers, Sender
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.rules import EffectKind, RuleMatch, fingerprint, same_payload
from sidecar.rules.model import Protocol as RuleProtocol
from sidecar.rules.model import Rule
from sidecar.rules.templates import TemplateValueMissing

_NOT_FORWARDED = {"content-type", "content-encoding", "content-length"}


@dataclass(frozen=True, slots=True)
class Described:
    """A matched request, named: its effect key, its payload's fingerprint, what to log."""

    key: str
    fingerprint: str
    summary: dict[str, Any] = field(default_factory=dict)
    push: git.Push | None = None


@dataclass(frozen=True, slots=True)
class Content:
    status: int
    headers: Headers
    body: bytes


class Codec(Protocol):
    def describe(self, match: RuleMatch, request: AgentRequest) -> Described: ...

    def replay(self, effect: Effect, described: Described) -> Content:
        """The answer for a completed effect, to the request now asking."""
        ...

    def reject(self, effect: Effect, described: Described) -> Content | None:
        """The answer refusing a divergent replay, or None for a 422 problem."""
        ...

    def diverges(self, effect: Effect, described: Described, request: AgentRequest) -> bool:
        """Whether ``request`` carries another payload than the one ``effect`` recorded."""
        ...

    def classify(self, rule: Rule, reply: Reply) -> EffectState: ...

    def already_exists(self, rule: Rule, reply: Reply) -> bool: ...

    async def probe(
        self,
        sender: Sender,
        match: RuleMatch,
        request: AgentRequest,
        effect: Effect,
        described: Described,
    ) -> RecordedResponse | None:
        """Evidence the effect happened, as the response to record; None if it did not."""
        ...


def _auth_headers(request: AgentRequest, skip: set[str]) -> list[tuple[str, str]]:
    """The agent's headers minus its body's: its credentials authorise the probe too."""
    return [(n, v) for n, v in request.headers if n.lower() not in _NOT_FORWARDED | skip]


async def _ask(
    sender: Sender,
    method: str,
    url: URL,
    headers: Iterable[tuple[str, str]],
    timeout_s: float,
    probe: str,
) -> Reply:
    """A probe's request; no answer is :class:`ProbeFailed`, naming ``probe`` and the URL."""
    try:
        return await sender.send(method, url, headers, None, timeout_s=timeout_s)
    except UpstreamError as error:
        raise ProbeFailed(f"{probe} {url} failed: {error}") from error


class HttpCodec:
    def describe(self, match: RuleMatch, request: AgentRequest) -> Described:
        return Described(match.key(request.facts), fingerprint(request.facts))

    def replay(self, effect: Effect, described: Described) -> Content:
        response = effect.response
        assert response is not None  # completed effects always carry their response
        return Content(response.status, response.headers, response.body)

    def reject(self, effect: Effect, described: Described) -> Content | None:
        return None

    def diverges(self, effect: Effect, described: Described, request: AgentRequest) -> bool:
        return not same_payload(effect.fingerprint, request.facts, described.fingerprint)

    def classify(self, rule: Rule, reply: Reply) -> EffectState:
        if rule.effect is EffectKind.CACHE:
            # Only successes are worth answering from the log; anything else is asked again.
            return EffectState.COMPLETED if 200 <= reply.status < 300 else EffectState.FAILED
        if reply.status >= 500:
            return EffectState.UNKNOWN  # the upstream may or may not have acted
        return EffectState.COMPLETED if reply.status < 400 else EffectState.FAILED

    def already_exists(self, rule: Rule, reply: Reply) -> bool:
        spec = rule.exists_when
        if spec is None or reply.status not in spec.status:
            return False
        try:
            return bool(spec.found.search(json.loads(reply.body)))
        except ValueError:
            return False

    async def probe(
        self,
        sender: Sender,
        match: RuleMatch,
        request: AgentRequest,
        effect: Effect,
        described: Described,
    ) -> RecordedResponse | None:
        rule = match.rule
        spec = rule.probe
        if spec is None:
            raise ProbeFailed(f"rule {rule.name} has no probe")
        facts = request.facts
        try:
            target = spec.request.path.render(facts, match.params)
            extra = {n: t.render(facts, match.params) for n, t in spec.request.headers.items()}
        except TemplateValueMissing as missing:
            raise ProbeFailed(f"rule {rule.name}: cannot build the probe: {missing}") from missing
        url = sender.url(request.scheme, spec.request.host or facts.host, facts.port, target)
        skip = {rule.idempotency_header.lower()} if rule.idempotency_header else set()
        headers = _auth_headers(request, skip) + list(extra.items())
        probe = f"rule {rule.name}: probe"
        reply = await _ask(sender, spec.request.method, url, headers, rule.timeout_s, probe)
        if reply.status in spec.missing_status:
            return None
        if reply.status not in spec.found_status:
            raise ProbeFailed(f"rule {rule.name}: probe {url} answered {reply.status}")
        try:
            data = json.loads(reply.body)
        except ValueError as error:
            raise ProbeFailed(f"rule {rule.name}: probe {url} did not answer JSON") from error
        if not spec.found.search(data):
            return None
        body = data if spec.answer.body is None else spec.answer.body.search(data)
        return RecordedResponse(
            spec.answer.status, (("Content-Type", "application/json"),), json.dumps(body).encode()
        )


_RESULT = (
    ("Content-Type", "application/x-git-receive-pack-result"),
    ("Cache-Control", "no-cache"),
)


class GitPushCodec:
    def describe(self, match: RuleMatch, request: AgentRequest) -> Described:
        try:
            push = git.parse_receive_pack(request.body)
        except git.GitProtocolError as error:
            raise InvalidRequest(f"not a git push: {error}") from error
        prefix = _repository(request)
        if match.rule.key is not None:
            with contextlib.suppress(TemplateValueMissing):
                prefix = match.rule.key.render(request.facts, match.params)
        # `repo` and `repo.git` are one repository to git hosts, so one effect here.
        prefix = prefix.removesuffix(".git")
        key = f"{prefix}@{','.join(sorted(push.refs))}"
        return Described(key, push.fingerprint(), {"git": push.summary()}, push)

    def replay(self, effect: Effect, described: Described) -> Content:
        assert described.push is not None
        refs = ", ".join(described.push.refs)
        note = (
            f"effect-sidecar: {refs} already pushed by attempt {effect.origin_attempt_id}; "
            "the first push stands, this one was not sent"
        )
        return Content(200, _RESULT, git.report_status(described.push, message=note))

    def reject(self, effect: Effect, described: Described) -> Content | None:
        assert described.push is not None
        why = "effect-sidecar: this task already pushed a different tree here"
        note = (
            f"effect-sidecar: attempt {effect.origin_attempt_id} of this task already pushed "
            f"{', '.join(described.push.refs)} with a different tree; refusing to overwrite it"
        )
        rejected = dict.fromkeys(described.push.refs, why)
        return Content(200, _RESULT, git.report_status(described.push, rejected, note))

    def diverges(self, effect: Effect, described: Described, request: AgentRequest) -> bool:
        return effect.fingerprint != described.fingerprint

    def classify(self, rule: Rule, reply: Reply) -> EffectState:
        if reply.status >= 500:
            return EffectState.UNKNOWN
        if reply.status >= 400:
            return EffectState.FAILED
        results = git.read_report(reply.body)
        if results is None:
            return EffectState.UNKNOWN
        return EffectState.FAILED if any(results.values()) else EffectState.COMPLETED

    def already_exists(self, rule: Rule, reply: Reply) -> bool:
        return False

    async def probe(
        self,
        sender: Sender,
        match: RuleMatch,
        request: AgentRequest,
        effect: Effect,
        described: Described,
    ) -> RecordedResponse | None:
        """Does the remote advertise every ref of the earlier push at the commit it sent?"""
        assert described.push is not None
        facts = request.facts
        target = f"{_repository_path(request)}/info/refs?service=git-upload-pack"
        url = sender.url(request.scheme, facts.host, facts.port, target)
        headers = _auth_headers(request, set())
        reply = await _ask(sender, "GET", url, headers, match.rule.timeout_s, "git probe")
        if reply.status != 200:
            raise ProbeFailed(f"git probe {url} answered {reply.status}")
        try:
            advertised = git.advertised_refs(reply.body)
        except git.GitProtocolError as error:
            raise ProbeFailed(f"git probe {url}: {error}") from error
        earlier = effect.request.get("git", {}).get("updates", [])
        landed = all(
            advertised.get(u["ref"]) == (None if u["new"] == git.ZERO_SHA else u["new"])
            for u in earlier
        )
        if not earlier or not landed:
            return None
        return RecordedResponse(200, _RESULT, git.report_status(described.push))


def _repository_path(request: AgentRequest) -> str:
    return request.facts.path.removesuffix("/git-receive-pack")


def _repository(request: AgentRequest) -> str:
    return request.facts.host + _repository_path(request).removesuffix(".git")


def codec_for(rule: Rule, http: HttpCodec, push: GitPushCodec) -> Codec:
    return push if rule.protocol is RuleProtocol.GIT_RECEIVE_PACK else http
