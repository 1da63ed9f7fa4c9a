"""Where mitmproxy hands matched requests to the effect guard.

``requestheaders``: match the rules on the request line and headers (the body has not
arrived).  Unmatched requests, and rules for reads or idempotent calls, are streamed
through untouched and never buffered whole; a matched effect's body is buffered (it
is needed for the key) up to its rule's ``max_body_bytes``, over which it gets a 413
before the body is even read.

``request``: the body is here; resolve the binding, let the guard decide, and answer
the agent ourselves - mitmproxy never forwards a guarded request.  Both hooks answer
any exception themselves (500 ``sidecar_error``): an exception that left a hook would
let mitmproxy forward the flow on its own, unrecorded (SPEC §3.6).  A request whose
rules cannot even be matched is answered the same way: it might have been an effect.
"""

from __future__ import annotations

import logging

from mitmproxy import http
from mitmproxy.utils.strutils import always_bytes

from sidecar.errors import PayloadTooLarge, SidecarError, SidecarFault
from sidecar.metrics import Metrics
from sidecar.proxy.addons.binder import METADATA
from sidecar.proxy.exchange import AgentRequest, Answer, refusal
from sidecar.proxy.guard import EffectGuard, fault
from sidecar.rules import RuleMatch, RuleSet
from sidecar.rules.matcher import HttpRequestFacts

log = logging.getLogger("sidecar.proxy")

GUARDED = "sidecar.guarded"


def is_guarded(flow: http.HTTPFlow) -> bool:
    return GUARDED in flow.metadata


def to_response(answer: Answer) -> http.Response:
    response = http.Response.make(
        answer.status,
        b"",
        [(always_bytes(n), always_bytes(v, "utf-8", "surrogateescape")) for n, v in answer.headers],
    )
    # raw_content: the body goes out exactly as recorded (still compressed if it was).
    response.raw_content = answer.body
    response.headers["content-length"] = str(len(answer.body))
    return response


def _headers(message: http.Message) -> tuple[tuple[str, str], ...]:
    """All header fields, repeated ones included, in order (as mitmproxy decodes them)."""
    return tuple(
        (n.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
        for n, v in message.headers.fields
    )


def _facts(flow: http.HTTPFlow, body: bytes | None) -> HttpRequestFacts:
    request = flow.request
    return HttpRequestFacts.from_target(
        request.method, request.pretty_host, request.port, request.path, _headers(request), body
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
            flow.response = to_response(
                refusal(SidecarFault(f"matching the request failed: {unexpected!r}"))
            )

    def _admit(self, flow: http.HTTPFlow) -> None:
        """Stream what no effect rule matches; mark and size-check what one does."""
        # Most traffic is to hosts no effect rule names: decide that before parsing more.
        if not self.rules.may_match_host(flow.request.pretty_host, flow.request.port):
            flow.request.stream = True
            return
        match = self.rules.match(_facts(flow, None))
        if match is None or not match.rule.logged:
            flow.request.stream = True
            return
        flow.metadata[GUARDED] = match
        declared = flow.request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > match.rule.max_body_bytes:
            too_large = PayloadTooLarge(
                f"rule {match.rule.name} records bodies up to {match.rule.max_body_bytes} "
                f"bytes; this one declares {declared}"
            )
            flow.response = to_response(refusal(too_large))

    async def request(self, flow: http.HTTPFlow) -> None:
        # mitmproxy calls this hook even for a flow answered in requestheaders.
        match: RuleMatch | None = flow.metadata.get(GUARDED)
        if match is None or flow.response is not None:
            return
        try:
            await self._guard(flow, match)
        except Exception as unexpected:  # SPEC §3.6: never forward on failure
            log.exception("guarding %s failed", match.rule.name, extra={"rule": match.rule.name})
            flow.response = to_response(refusal(fault(unexpected, match.rule)))

    async def _guard(self, flow: http.HTTPFlow, match: RuleMatch) -> None:
        seen = flow.request
        what = f"{seen.method} {seen.pretty_host}{seen.path} (rule {match.rule.name})"
        try:
            binding = await self.guard.recorder.bind(flow.metadata.get(METADATA), what, "proxy")
        except SidecarError as error:
            log.warning("binding refused: %s", error.detail, extra={"rule": match.rule.name})
            flow.response = to_response(refusal(error))
            return
        request = AgentRequest(
            facts=_facts(flow, flow.request.raw_content or b""),
            scheme=flow.request.scheme,
            target=flow.request.path,
            headers=_headers(flow.request),
        )
        flow.response = to_response(await self.guard.handle(binding, match, request))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if is_guarded(flow) or flow.response is None:
            return
        flow.response.stream = True
        flow.response.headers["X-Sidecar-Effect"] = "passthrough"
        self.metrics.passthrough.inc()
