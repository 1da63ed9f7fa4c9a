"""Writes no rule covers, and connections the proxy never sees inside.

A POST, PUT, PATCH or DELETE that no rule matches is streamed through as ``passthrough``
(the effect addon decides that and marks the flow ``UNMATCHED``).  It may well be an
effect the rules forgot, so ``serve --uncovered-writes`` says what to do with it:

* ``log`` (default): log it at WARNING once per (host, method, path shape) - the path
  with ids, hex and numbers as ``{id}``, the query dropped (:mod:`sidecar.rules.shapes`) -
  and count it in ``sidecar_uncovered_writes_total{host,method}``;
* ``record``: also keep it in the bound task's effect log as an effect of kind and rule
  ``uncovered`` (request summary only, redacted; the answer's status, never its body),
  so ``sidecar effects``, the control API and the review list it.  Its key is unique
  (``uncovered:METHOD HOST SHAPE#RANDOM``), so no rule's key ever meets it: the guard
  never replays it, and the request still streams through unbuffered.  A request bound
  to no task is only logged and counted; a store that cannot record it is logged, and
  the request still goes (this is an inventory, not a guard);
* ``deny``: answer 403 ``uncovered_write`` (problem+json naming host, method, path and
  where to add a rule) and forward nothing.

Hosts no rule or route names are relayed as raw bytes (``allow_hosts``), never seen as
HTTP; :class:`TunnelCounter` counts those connections by their CONNECT or SNI host.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from enum import StrEnum
from pathlib import Path
from typing import Any

from mitmproxy import http
from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.proxy import layer, layers

from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.domain.text import scrubbed
from sidecar.errors import SidecarError
from sidecar.proxy.addons.binder import METADATA
from sidecar.proxy.addons.effects import UNMATCHED, decoded_headers, is_guarded, to_response
from sidecar.proxy.body_limit import answer_before_body
from sidecar.proxy.exchange import refusal
from sidecar.proxy.hosts import request_host
from sidecar.proxy.redact import request_summary
from sidecar.recording.bindings import Binding
from sidecar.recording.recorder import Recorder
from sidecar.rules import RuleSet
from sidecar.rules.facts import HttpRequestFacts
from sidecar.rules.matcher import fingerprint
from sidecar.rules.shapes import as_template, request_shape
from sidecar.runtime.metrics import Metrics

log = logging.getLogger("sidecar.proxy")

_RECORDED = "sidecar.uncovered.recorded"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNCOVERED = "uncovered"  # the kind and rule name of a recorded uncovered write
MAX_SHAPES_LOGGED = 10_000  # distinct (host, method, shape) remembered for "log once"


class UncoveredMode(StrEnum):
    LOG = "log"
    RECORD = "record"
    DENY = "deny"


class UncoveredWrite(
    SidecarError, code="uncovered_write", status=403, title="Write not covered by any rule"
):
    """A write no effect rule covers; ``--uncovered-writes deny`` refuses it."""

    def __init__(self, detail: str, members: dict[str, Any]) -> None:
        super().__init__(detail)
        self.members = members

    def extensions(self) -> dict[str, Any]:
        return self.members


def rule_files_for(rules: RuleSet, host: str, port: int | None) -> list[Path]:
    """The rule files that already have a rule for ``host``, in load order."""
    files: list[Path] = []
    for rule in rules:
        source = rules.sources.get(rule.name)
        if rule.http is None or source is None or source.file in files:
            continue
        if any(pattern.matches(host, port) for pattern in rule.http.host):
            files.append(source.file)
    return files


class UncoveredWrites:
    def __init__(
        self, mode: UncoveredMode, rules: RuleSet, metrics: Metrics, recorder: Recorder
    ) -> None:
        self.mode = mode
        self.rules = rules
        self.metrics = metrics
        self.recorder = recorder
        self._logged: set[tuple[str, str, str]] = set()

    # The hooks are plain functions that return a coroutine only for a flow they have
    # work for (HookDispatch and mitmproxy await it): a coroutine function's hook would
    # make one for every flow that goes by, and make the whole dispatch one too.

    def requestheaders(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        request = flow.request
        if flow.response is not None or is_guarded(flow) or not flow.metadata.get(UNMATCHED):
            return None
        if request.method.upper() not in WRITES:
            return None
        return self._note(flow)

    async def _note(self, flow: http.HTTPFlow) -> None:
        try:
            await self._uncovered(flow)
        except Exception:  # an inventory must never break the request it is about
            log.exception("noting an uncovered write failed")

    async def _uncovered(self, flow: http.HTTPFlow) -> None:
        request = flow.request
        host, method = request_host(request).lower(), request.method.upper()
        shape = request_shape(request.path)
        self.metrics.uncovered_writes.labels(self.metrics.uncovered_hosts(host), method).inc()
        self._log_once(host, method, shape)
        if self.mode is UncoveredMode.DENY:
            flow.request.stream = False  # answered here: the body is never read
            answer_before_body(flow, to_response(refusal(self._refusal(flow, shape))))
        elif self.mode is UncoveredMode.RECORD:
            await self._record(flow, shape)

    def _log_once(self, host: str, method: str, shape: str) -> None:
        seen = (host, method, shape)
        if seen in self._logged:
            return
        if len(self._logged) >= MAX_SHAPES_LOGGED:
            return  # still counted; the log is not a place for unbounded variety
        self._logged.add(seen)
        log.warning(
            "uncovered write: %s %s%s matches no effect rule (%s)",
            method,
            host,
            shape,
            self.mode.value,
            extra={"host": host, "method": method, "shape": shape, "uncovered": self.mode.value},
        )

    def _refusal(self, flow: http.HTTPFlow, shape: str) -> UncoveredWrite:
        request = flow.request
        host, method = request_host(request).lower(), request.method.upper()
        path = request.path.partition("?")[0]
        files = rule_files_for(self.rules, host, request.port)
        where = (
            f"add a rule for it to {files[0]}"
            if files
            else "add a rule for it to a rule file given with --rules"
        )
        detail = (
            f"{method} {host}{path} matches no effect rule and this sidecar refuses "
            f"uncovered writes (--uncovered-writes deny); {where}, e.g. "
            f'match: {{host: {host}, method: {method}, path: "{as_template(shape)}"}}'
        )
        members = {
            "host": host,
            "method": method,
            "path": path,
            "shape": shape,
            "rule_file": str(files[0]) if files else None,
            "suggested_match": {"host": host, "method": method, "path": as_template(shape)},
        }
        return UncoveredWrite(detail, members)

    # ---- record ----------------------------------------------------------------------

    async def _record(self, flow: http.HTTPFlow, shape: str) -> None:
        request = flow.request
        host, method = request_host(request).lower(), request.method.upper()
        what = f"{method} {host}{shape} (uncovered)"
        try:
            binding = await self.recorder.bind(flow.metadata.get(METADATA), what, "proxy")
        except SidecarError as error:
            log.warning("uncovered write %s not recorded: %s", what, error.detail)
            return
        if binding is None:
            return  # bound to no task: logged and counted only
        authority = host if request.port in (80, 443) else f"{host}:{request.port}"
        headers = decoded_headers(request)
        summary = request_summary(
            method,
            request.scheme,
            authority,
            request.path.partition("?")[0],
            request.path.partition("?")[2],
            headers,
            None,  # the body streams through: it is never read here
        )
        facts = HttpRequestFacts.from_target(method, host, request.port, request.path, headers)
        key = f"{UNCOVERED}:{method} {host}{shape}#{secrets.token_hex(8)}"
        pending = self.recorder.store.record_pending
        recorded = await self._durably(
            f"uncovered write {what} not recorded",
            lambda: pending(
                binding.task,
                key,
                binding.attempt_id,
                binding.generation,
                kind=UNCOVERED,
                rule=UNCOVERED,
                fingerprint=fingerprint(facts),
                idempotency_key=None,
                request=scrubbed(summary | {"shape": shape}),
            ),
        )
        if recorded:
            flow.metadata[_RECORDED] = (binding, key)

    def responseheaders(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        recorded: tuple[Binding, str] | None = flow.metadata.pop(_RECORDED, None)
        if recorded is None or flow.response is None:
            return None
        status = flow.response.status_code
        state = EffectState.COMPLETED if status < 400 else EffectState.FAILED
        return self._settle(recorded, state, RecordedResponse(status), f"answered {status}")

    def error(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        recorded: tuple[Binding, str] | None = flow.metadata.pop(_RECORDED, None)
        if recorded is None:
            return None
        why = flow.error.msg if flow.error else "no answer"
        return self._settle(recorded, EffectState.FAILED, None, f"no answer: {why}")

    async def _settle(
        self,
        recorded: tuple[Binding, str],
        state: EffectState,
        response: RecordedResponse | None,
        detail: str,
    ) -> None:
        binding, key = recorded
        transition = self.recorder.store.transition_effect
        await self._durably(
            f"uncovered write {key}: outcome not recorded",
            lambda: transition(
                binding.task,
                key,
                binding.attempt_id,
                binding.generation,
                state,
                response=response,
                detail=detail,
            ),
        )

    async def _durably(self, failed: str, write: Callable[[], Awaitable[object]]) -> bool:
        """A store write, retried as the recorder does; one that still fails is logged
        (``failed: why``), and the request goes on: this is an inventory, not a guard."""
        try:
            await self.recorder.durably(write)
        except SidecarError as error:
            log.warning("%s: %s", failed, error.detail)
            return False
        return True


class TunnelCounter:
    """Counts connections mitmproxy relays as raw bytes (hosts not in ``allow_hosts``).

    Runs after mitmproxy's own ``next_layer`` decision (default addons come first) and
    counts each connection it decided to ignore, by the CONNECT host or the TLS SNI.
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        chosen = nextlayer.layer
        if not isinstance(chosen, layers.TCPLayer) or chosen.flow is not None:
            return
        host = _tunnel_host(nextlayer)
        self.metrics.tunnelled_connections.labels(self.metrics.tunnelled_hosts(host)).inc()


def _tunnel_host(nextlayer: layer.NextLayer) -> str:
    context = nextlayer.context
    data: bytes = nextlayer.data_client()  # type: ignore[no-untyped-call]
    try:
        hello = NextLayer._get_client_hello(context, data)
    except Exception:  # not TLS, or not all of it yet: the address will do
        hello = None
    if hello is not None and hello.sni:
        return str(hello.sni).lower()
    if context.client.sni:
        return str(context.client.sni).lower()
    if context.server.address:
        return str(context.server.address[0]).lower()
    return "unknown"
