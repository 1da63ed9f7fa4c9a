"""Where mitmproxy hands matched requests to the effect guard.

``requestheaders``: match the rules on the request line and headers (the body has not
arrived).  Unmatched requests, and rules for reads or idempotent calls, are streamed
through untouched and never buffered whole; a matched effect's body is buffered (it
is needed for the key) up to its rule's ``max_body_bytes``: a larger declared length gets
a 413 before the body is read, a chunked body is cut off with a 413 once it passes the
limit (:mod:`sidecar.proxy.body_limit`).

``request``: the body is here; resolve the binding, let the guard decide, and answer
the agent ourselves - mitmproxy never forwards a guarded request.  The request's facts
and headers are the ones decoded in ``requestheaders`` (no addon changes a guarded
request in between), with the body added.  Both hooks answer
any exception themselves (500 ``sidecar_error``): an exception that left a hook would
let mitmproxy forward the flow on its own, unrecorded (SPEC §3.6).  A request whose
rules cannot even be matched is answered the same way: it might have been an effect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from mitmproxy import http
from mitmproxy.net.http import status_codes

from sidecar.errors import PayloadTooLarge, SidecarError, SidecarFault
from sidecar.proxy.addons.binder import METADATA
from sidecar.proxy.body_limit import BodyLimit, answer_before_body, limit_body
from sidecar.proxy.exchange import AgentRequest, Answer, Headers, refusal
from sidecar.proxy.guard import EffectGuard, fault
from sidecar.proxy.hosts import request_host
from sidecar.proxy.redact import without_secrets
from sidecar.proxy.upstream import header_bytes
from sidecar.rules import RuleMatch, RuleSet
from sidecar.rules.facts import HttpRequestFacts
from sidecar.runtime.metrics import Metrics

log = logging.getLogger("sidecar.proxy")

GUARDED = "sidecar.guarded"
UNMATCHED = "sidecar.unmatched"  # no rule matched: a write is one no rule covers (uncovered.py)


@dataclass(frozen=True, slots=True)
class Guarded:
    """A matched effect between ``requestheaders`` and ``request``: its rule, and the
    request as matched (its body not yet read)."""

    match: RuleMatch
    facts: HttpRequestFacts
    headers: Headers


def is_guarded(flow: http.HTTPFlow) -> bool:
    return GUARDED in flow.metadata


#: Answers that carry no Content-Length: 204 must not (RFC 9110 §8.6), and a 304's would
#: describe the representation it stands for, which a recorded answer does not hold.
_NO_CONTENT_LENGTH = frozenset({204, 304})


def to_response(answer: Answer) -> http.Response:
    """``answer`` as mitmproxy sends it.

    Built directly rather than through ``Response.make``, which encodes the body and sets
    its length in two more passes over the header fields; and without ``Response``'s
    constructor, whose ``__post_init__`` type-checks every field against its annotation
    (about 30 us, a tenth of the sidecar's own work on a replay), nor ``Headers``'s, which
    checks each field is bytes - the fields here have those types by construction.
    ``tests/unit/proxy/test_small_parts.py`` holds the two ways equal."""
    fields = [
        (header_bytes(n), header_bytes(v))
        for n, v in answer.headers
        if n.lower() != "content-length"
    ]
    if answer.status not in _NO_CONTENT_LENGTH:
        fields.append((b"content-length", b"%d" % len(answer.body)))
    headers = object.__new__(http.Headers)
    headers.fields = tuple(fields)
    now = time.time()
    data = object.__new__(http.ResponseData)
    data.__dict__.update(
        http_version=b"HTTP/1.1",
        headers=headers,
        content=answer.body,  # out exactly as recorded (still compressed if it was)
        trailers=None,
        timestamp_start=now,
        timestamp_end=now,
        status_code=answer.status,
        reason=status_codes.RESPONSES.get(answer.status, "").encode(),
    )
    response = object.__new__(http.Response)
    response.data = data
    return response


def decoded_headers(message: http.Message) -> Headers:
    """All header fields, repeated ones included, in order (as mitmproxy decodes them)."""
    return tuple(
        (n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
        for n, v in message.headers.fields
    )


class EffectAddon:
    def __init__(self, rules: RuleSet, guard: EffectGuard, metrics: Metrics) -> None:
        self.rules = rules
        self.guard = guard
        self.metrics = metrics

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        try:
            self._admit(flow)
        except Exception as unexpected:  # SPEC §3.6: never forward on failure
            log.exception("matching %s %s failed", flow.request.method, flow.request.pretty_url)
            flow.request.stream = False
            flow.metadata[GUARDED] = None
            failed = SidecarFault(f"matching the request failed: {unexpected!r}")
            answer_before_body(flow, to_response(refusal(failed)))

    def _admit(self, flow: http.HTTPFlow) -> None:
        """Stream what no effect rule matches; mark and size-check what one does."""
        request = flow.request
        host = request_host(request)
        # Most traffic is to hosts no effect rule names: decide that before parsing more.
        if not self.rules.may_match_host(host, request.port):
            request.stream = True
            flow.metadata[UNMATCHED] = True
            return
        headers = decoded_headers(request)
        facts = HttpRequestFacts.from_target(
            request.method, host, request.port, request.path, headers
        )
        match = self.rules.match(facts)
        if match is None:
            flow.metadata[UNMATCHED] = True
        if match is None or not match.rule.logged:
            request.stream = True
            return
        flow.metadata[GUARDED] = Guarded(match, facts, headers)
        rule = match.rule

        def too_large(size: str) -> http.Response:
            limit = f"rule {rule.name} records bodies up to {rule.max_body_bytes} bytes"
            return to_response(refusal(PayloadTooLarge(f"{limit}; this one {size}")))

        declared = facts.headers.get("content-length", "")  # the first such field
        if declared.isdigit() and int(declared) > rule.max_body_bytes:
            answer_before_body(flow, too_large(f"declares {declared}"))
            return
        limit_body(
            flow, BodyLimit(rule.max_body_bytes, lambda seen: too_large(f"was cut off at {seen}"))
        )

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A guarded flow's work, as a coroutine mitmproxy awaits; None for every other
        flow (a coroutine function would make a coroutine for each, and make the whole
        hook dispatch one)."""
        # mitmproxy calls this hook even for a flow answered in requestheaders.
        guarded: Guarded | None = flow.metadata.get(GUARDED)
        if guarded is None or flow.response is not None:
            return None
        return self._answer(flow, guarded)

    async def _answer(self, flow: http.HTTPFlow, guarded: Guarded) -> None:
        rule = guarded.match.rule
        try:
            await self._guard(flow, guarded)
        except Exception as unexpected:  # SPEC §3.6: never forward on failure
            log.exception("guarding %s failed", rule.name, extra={"rule": rule.name})
            flow.response = to_response(refusal(fault(unexpected, rule)))

    async def _guard(self, flow: http.HTTPFlow, guarded: Guarded) -> None:
        match, seen, target = guarded.match, flow.request, flow.request.path
        # As the guard's audit lines name it: no query, no secret path parameters.
        path = without_secrets(guarded.facts.path, match.secrets)
        what = f"{seen.method} {guarded.facts.host}{path} (rule {match.rule.name})"
        try:
            binding = await self.guard.recorder.bind(flow.metadata.get(METADATA), what, "proxy")
        except SidecarError as error:
            log.warning("binding refused: %s", error.detail, extra={"rule": match.rule.name})
            flow.response = to_response(refusal(error))
            return
        request = AgentRequest(
            facts=guarded.facts.with_body(seen.raw_content or b""),
            scheme=seen.scheme,
            target=target,
            headers=guarded.headers,
        )
        flow.response = to_response(await self.guard.handle(binding, match, request))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if is_guarded(flow) or flow.response is None:
            return
        flow.response.stream = True
        flow.response.headers["X-Sidecar-Effect"] = "passthrough"
        self.metrics.passthrough.inc()
