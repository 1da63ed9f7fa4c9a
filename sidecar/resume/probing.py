"""Asking the outside world, now, whether a logged effect happened - as the proxy would.

The probe itself is the proxy's: :meth:`HttpCodec.probe` (the rule's probe request and
its JMESPath ``found``) or :meth:`GitPushCodec.probe` (the repository's advertised refs),
sent through a :class:`~sidecar.proxy.exchange.Sender` (the sidecar's upstream client,
with its ``--route`` table).  What this module adds is the request those codecs probe
*for*: the proxy has the agent's live request; resume has only the effect log's record
of it (:func:`sidecar.proxy.redact.request_summary`: method, URL, header names and
values with secrets redacted, a redacted copy of a JSON body, a git push's ref updates).
So the request is rebuilt from that record, and:

* the agent's credentials were never stored, so the operator gives them
  (``--probe-header NAME:VALUE``); redacted header values are not sent;
* a probe that would carry a redacted value (a secret path parameter, a redacted body
  field) is not sent - it would ask about something else - and an HTTP request that no
  longer keys to the same effect is not probed either: both are "cannot probe";
* anything that goes wrong is "cannot probe", never "not found".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from urllib.parse import quote, urlsplit

from yarl import URL

from sidecar.domain.model import Effect
from sidecar.errors import SidecarError
from sidecar.proxy import git
from sidecar.proxy.codecs import Described, GitPushCodec, HttpCodec, codec_for
from sidecar.proxy.exchange import AgentRequest, Sender
from sidecar.proxy.redact import MAX_BODY_EXCERPT, REDACTED
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.resume.model import Found, Probed
from sidecar.rules import HttpRequestFacts, Protocol, RuleMatch, RuleSet
from sidecar.rules.matcher import http_match
from sidecar.rules.model import Rule

_REDACTED_FORMS = (REDACTED, quote(REDACTED), quote(REDACTED, safe=""))


class NotProbeable(Exception):
    """The effect log's record cannot be turned back into the request to probe for."""


class _Asking:
    """The sender, refusing to send a redacted value, and remembering what it asked."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender
        self.asked: list[str] = []

    def url(self, scheme: str, host: str, port: int | None, path_and_query: str) -> URL:
        return self._sender.url(scheme, host, port, path_and_query)

    async def send(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
    ) -> Reply:
        headers = list(headers)
        if any(form in str(url) for form in _REDACTED_FORMS) or any(
            REDACTED in value for _, value in headers
        ):
            raise UpstreamError(
                f"{method} {url}: not sent, it would carry a value the effect log keeps redacted",
                sent=False,
            )
        reply = await self._sender.send(method, url, headers, body, timeout_s=timeout_s)
        self.asked.append(f"{method} {url} answered {reply.status}")
        return reply


class Prober:
    """Probes logged effects with the loaded rules, a sender and the operator's headers."""

    def __init__(
        self, rules: RuleSet, sender: Sender, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        self._rules = rules
        self._sender = sender
        self._headers = tuple(headers)
        self._http = HttpCodec()
        self._git = GitPushCodec()

    async def probe(self, effect: Effect) -> Probed:
        rule = self._rules.get(effect.rule)
        if rule is None:
            return Probed(found=Found.CANNOT_PROBE, evidence=f"rule {effect.rule} is not loaded")
        asking = _Asking(self._sender)
        try:
            match, request, described = self._rebuild(effect, rule)
            codec = codec_for(rule, self._http, self._git)
            evidence = await codec.probe(asking, match, request, effect, described)
        except NotProbeable as cannot:
            return Probed(found=Found.CANNOT_PROBE, evidence=str(cannot))
        except SidecarError as error:  # ProbeFailed: no probe, not built, no answer, not JSON
            return Probed(found=Found.CANNOT_PROBE, evidence=error.detail)
        except Exception as unexpected:  # fail closed: an error is never "not found"
            why = f"{type(unexpected).__name__}: {unexpected}"
            return Probed(found=Found.CANNOT_PROBE, evidence=why)
        asked = "; ".join(asking.asked) or "nothing asked"
        if evidence is None:
            return Probed(found=Found.NOT_FOUND, evidence=asked)
        return Probed(found=Found.FOUND, evidence=f"{asked}; evidence: status {evidence.status}")

    def _rebuild(self, effect: Effect, rule: Rule) -> tuple[RuleMatch, AgentRequest, Described]:
        request = rebuild_request(effect.request, self._headers)
        if rule.http is None:
            raise NotProbeable(f"rule {rule.name} is not an HTTP rule")
        params = http_match(rule.http, request.facts)
        if params is None:
            raise NotProbeable(f"the logged request no longer matches rule {rule.name}")
        match = RuleMatch(rule, params)
        if rule.protocol is Protocol.GIT_RECEIVE_PACK:
            # The pack itself is not logged; the codec's probe needs only the ref updates.
            push = git.Push(_updates(effect.request), frozenset())
            return match, request, Described(effect.key, effect.fingerprint, push=push)
        described = self._http.describe(match, request)
        if described.key != effect.key:
            raise NotProbeable(
                f"rebuilt from the log the request keys as {described.key!r}, not "
                f"{effect.key!r} (a value the key needs was redacted)"
            )
        return match, request, described


def rebuild_request(summary: dict[str, object], extra: Sequence[tuple[str, str]]) -> AgentRequest:
    """The agent's request as the effect log recorded it, with ``extra`` headers (the
    operator's credentials) in place of any of the same name."""
    method, url = summary.get("method"), summary.get("url")
    if not isinstance(method, str) or not isinstance(url, str):
        raise NotProbeable("the effect log holds no request for it")
    parts = urlsplit(url)
    names = {name.lower() for name, _ in extra}
    logged = summary.get("headers")
    headers = [
        (str(name), str(value))
        for name, value in (logged.items() if isinstance(logged, dict) else ())
        if str(name).lower() not in names and REDACTED not in str(value)
    ] + list(extra)
    body = _body(summary)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    facts = HttpRequestFacts.from_target(
        method, parts.hostname or "", parts.port, target or "/", headers, body
    )
    return AgentRequest(facts, parts.scheme or "https", target or "/", tuple(headers))


def _body(summary: dict[str, object]) -> bytes | None:
    """The logged JSON body (secrets redacted), or None: not JSON, or cut short."""
    if "body" not in summary:
        return None
    body = summary["body"]
    if isinstance(body, str) and len(body) > MAX_BODY_EXCERPT:
        return None  # the log keeps a long body's first characters only
    return json.dumps(body).encode()


def _updates(summary: dict[str, object]) -> tuple[git.RefUpdate, ...]:
    logged = summary.get("git")
    updates = logged.get("updates") if isinstance(logged, dict) else None
    if not isinstance(updates, list) or not updates:
        raise NotProbeable("the effect log holds no ref updates for this push")
    try:
        return tuple(git.RefUpdate(u["old"], u["new"], u["ref"]) for u in updates)
    except (KeyError, TypeError) as error:
        raise NotProbeable(f"the logged ref updates are not readable: {error}") from error
