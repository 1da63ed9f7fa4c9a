"""The effect flow of SPEC §3 for one matched request, free of mitmproxy types.

Check the log first, then record the outcome - around every intercepted effect:

    fenced?  ──yes──▶ 409 stale_generation (bindings)            nothing forwarded
    in flight here? ─▶ wait for it, then look again               never sent twice
    completed ──────▶ replay the recorded answer                  X-Sidecar-Effect: replayed
    pending/unknown ▶ wait out settle time, then probe | retry | block
    failed ─────────▶ forward again, same idempotency key
    none ───────────▶ record pending (durable) → forward → record answer → answer

The store is written *before* anything is forwarded and *before* anything is answered; if
it cannot be written within a bounded retry, the request is refused (503
``store_unavailable``) and nothing is forwarded: the sidecar fails closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from yarl import URL

from sidecar import failpoints
from sidecar.aio import spawn
from sidecar.clock import Clock
from sidecar.domain.ids import idempotency_key
from sidecar.domain.model import Effect, EffectState, RecordedResponse
from sidecar.errors import (
    EffectExists,
    EffectSettling,
    EffectUnknown,
    PayloadMismatch,
    PayloadTooLarge,
    ProbeFailed,
    SidecarError,
    StoreUnavailable,
    TaskUnbound,
    Unavailable,
    UpstreamFailed,
)
from sidecar.metrics import Metrics
from sidecar.problems import PROBLEM_JSON, error_body
from sidecar.proxy.bindings import Binding, Bindings
from sidecar.proxy.redact import recordable_response_headers, request_summary
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.rules import EffectKind, OnDivergence, OnUnknown, RuleMatch, RuleSet
from sidecar.rules.matcher import HttpRequestFacts
from sidecar.rules.model import Rule
from sidecar.rules.templates import TemplateValueMissing
from sidecar.store import Store

log = logging.getLogger("sidecar.effects")

SETTLE_WAIT_MAX_S = 30.0
COMPLETED_CACHE = 4096  # completed effects kept in memory for replays
NOTED_MAX = 65536  # (attempt, effect, event) audit lines remembered as already written


class Sender(Protocol):
    """Where the guard sends effects and probes (:class:`sidecar.proxy.upstream.Upstream`)."""

    def url(self, scheme: str, host: str, port: int | None, path_and_query: str) -> URL: ...

    async def send(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | None,
        *,
        timeout_s: float,
    ) -> Reply: ...


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """The agent's request as the guard needs it."""

    facts: HttpRequestFacts
    scheme: str
    target: str  # path and query exactly as sent
    headers: tuple[tuple[str, str], ...]  # as sent, order and case kept

    @property
    def body(self) -> bytes:
        return self.facts.body or b""


@dataclass(frozen=True, slots=True)
class Answer:
    """What the agent gets back; ``disposition`` is the X-Sidecar-Effect value."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    disposition: str


def refusal(error: SidecarError) -> Answer:
    status, body = error_body(error)
    headers: list[tuple[str, str]] = [
        ("Content-Type", PROBLEM_JSON),
        ("X-Sidecar-Effect", "refused"),
    ]
    if isinstance(error, Unavailable) and error.retry_after_s is not None:
        headers.append(("Retry-After", str(max(1, round(error.retry_after_s)))))
    return Answer(status, tuple(headers), body, "refused")


def _classify(kind: EffectKind, status: int) -> EffectState:
    if kind is EffectKind.CACHE:
        # Only successes are worth answering from the log; anything else is asked again.
        return EffectState.COMPLETED if 200 <= status < 300 else EffectState.FAILED
    if status >= 500:
        return EffectState.UNKNOWN  # the upstream may or may not have acted
    return EffectState.COMPLETED if status < 400 else EffectState.FAILED


class EffectGuard:
    def __init__(
        self,
        store: Store,
        rules: RuleSet,
        bindings: Bindings,
        upstream: Sender,
        clock: Clock,
        metrics: Metrics,
        *,
        store_retry_s: float = 2.0,
    ) -> None:
        self._store = store
        self._rules = rules
        self._bindings = bindings
        self._upstream = upstream
        self._clock = clock
        self._metrics = metrics
        self._store_retry_s = store_retry_s
        self._in_flight: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._completed: OrderedDict[tuple[str, str], Effect] = OrderedDict()
        self._noted: set[tuple[str, str, str, str, str | None]] = set()

    async def handle(
        self, binding: Binding | None, match: RuleMatch, request: AgentRequest
    ) -> Answer:
        rule = match.rule
        try:
            answer = await self._handle(binding, match, request)
        except SidecarError as error:
            answer = refusal(error)
            log.warning(
                "effect refused: %s",
                error.detail,
                extra=_fields(binding, rule) | {"code": error.code},
            )
        self._metrics.effects.labels(rule.name, answer.disposition).inc()
        return answer

    async def _handle(
        self, binding: Binding | None, match: RuleMatch, request: AgentRequest
    ) -> Answer:
        rule = match.rule
        if binding is None:
            raise TaskUnbound(
                f"{request.facts.method} {request.facts.host}{request.facts.path} is a side "
                f"effect (rule {rule.name}) but no task is bound: run the agent under "
                "`sidecar exec --task TASK`, or send X-Sidecar-Task"
            )
        if len(request.body) > rule.max_body_bytes:
            raise PayloadTooLarge(
                f"rule {rule.name} records bodies up to {rule.max_body_bytes} bytes; "
                f"this one has {len(request.body)}"
            )
        key = self._rules.effect_key(match, request.facts)
        fingerprint = self._rules.fingerprint(request.facts)
        slot = (binding.task, key)
        while True:
            if (running := self._in_flight.get(slot)) is not None:
                # The same effect is being forwarded right now by this sidecar: wait for its
                # outcome instead of sending it a second time.
                await asyncio.shield(running)
                continue
            if (known := self._completed.get(slot)) is not None:
                return self._replay(binding, rule, known, fingerprint)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._in_flight[slot] = done
            try:
                return await self._first_try(binding, match, request, key, fingerprint)
            finally:
                del self._in_flight[slot]
                done.set_result(None)

    # ---- the effect was never seen --------------------------------------------------

    async def _first_try(
        self,
        binding: Binding,
        match: RuleMatch,
        request: AgentRequest,
        key: str,
        fingerprint: str,
    ) -> Answer:
        # Try to log the effect straight away: a new effect needs nothing more, and one
        # already logged comes back with the refusal - one store round trip either way.
        time_left = await self._bindings.with_time_left(binding)  # self-fencing
        facts = request.facts
        summary = request_summary(
            facts.method,
            request.scheme,
            facts.host if facts.port is None else f"{facts.host}:{facts.port}",
            facts.path,
            request.target.partition("?")[2],
            request.headers,
            request.body,
        )
        try:
            effect = await self._durably(
                lambda: self._store.record_pending(
                    binding.task,
                    key,
                    binding.attempt_id,
                    binding.generation,
                    kind="http",
                    rule=match.rule.name,
                    fingerprint=fingerprint,
                    idempotency_key=idempotency_key(binding.attempt_id, key),
                    request=summary,
                )
            )
        except EffectExists as logged:
            return await self._again(binding, match, request, logged.existing, fingerprint)
        failpoints.reach("effect.after_pending")
        return await self._forward(binding, match, request, effect, time_left, "recorded")

    # ---- the effect is in the log -----------------------------------------------------

    async def _again(
        self,
        binding: Binding,
        match: RuleMatch,
        request: AgentRequest,
        effect: Effect,
        fingerprint: str,
    ) -> Answer:
        rule = match.rule
        if effect.state is EffectState.COMPLETED:
            self._remember(effect)
            return self._replay(binding, rule, effect, fingerprint)
        if effect.state is EffectState.PENDING:
            # Pending, yet not in flight in this sidecar: whoever sent it died (or a stale
            # worker is still waiting for its answer). Its outcome is unknown.
            effect = await self._durably(
                lambda: self._store.transition_effect(
                    binding.task,
                    effect.key,
                    binding.attempt_id,
                    binding.generation,
                    EffectState.UNKNOWN,
                    detail="found pending with no live request in this sidecar",
                )
            )
        if rule.effect is EffectKind.CACHE or effect.state is EffectState.FAILED:
            # A model call is safe to ask again; a definitive failure changed nothing.
            return await self._retry(binding, match, request, effect, "recorded")
        return await self._resolve_unknown(binding, match, request, effect)

    def _replay(self, binding: Binding, rule: Rule, effect: Effect, fingerprint: str) -> Answer:
        """Answer from the log.  Nothing is forwarded, so the audit line need not be durable
        before the answer: it is written in the background (and logged if it cannot be)."""
        divergent = effect.fingerprint != fingerprint
        if divergent and rule.on_divergence is OnDivergence.REJECT:
            self._note_later(binding, effect, "divergent", "rejected: payload differs")
            raise PayloadMismatch(
                f"task {binding.task}: effect {effect.key!r} was already performed with a "
                "different payload (rule on_divergence: reject)"
            )
        detail = "payload differs from the recorded one" if divergent else None
        self._note_later(binding, effect, "replayed", detail)
        response = effect.response
        assert response is not None  # completed effects always carry their response
        headers = [*response.headers, ("X-Sidecar-Effect", "replayed")]
        headers.append(("Idempotent-Replayed", "true"))
        if divergent:
            headers.append(("X-Sidecar-Divergent", "true"))
        log.info("effect replayed", extra=_fields(binding, rule) | {"effect_key": effect.key})
        return Answer(response.status, tuple(headers), response.body, "replayed")

    def _remember(self, effect: Effect) -> None:
        """Keep a completed effect at hand: completed is final, so the copy never goes stale."""
        slot = (effect.task, effect.key)
        self._completed[slot] = effect
        self._completed.move_to_end(slot)
        while len(self._completed) > COMPLETED_CACHE:
            self._completed.popitem(last=False)

    async def _resolve_unknown(
        self, binding: Binding, match: RuleMatch, request: AgentRequest, effect: Effect
    ) -> Answer:
        rule = match.rule
        if rule.on_unknown is OnUnknown.BLOCK:
            raise EffectUnknown(
                binding.task,
                effect.key,
                f"task {binding.task}: the outcome of {effect.key!r} (attempt "
                f"{effect.attempt_id}) is unknown and rule {rule.name} has no probe and no "
                "safe retry: CANNOT DETERMINE - a human must check the outside world "
                f"(see `sidecar effects {binding.task}`)",
            )
        if rule.on_unknown is OnUnknown.PROBE:
            # (A retry needs no settling: the API dedupes on the idempotency key we resend.)
            await self._settle(binding, rule, effect)
            evidence = await self._probe(match, request)
            if evidence is not None:
                return await self._complete_from_evidence(binding, rule, effect, evidence)
        return await self._retry(binding, match, request, effect, "recorded")

    async def _settle(self, binding: Binding, rule: Rule, effect: Effect) -> None:
        """Wait until whoever left the effect unresolved can no longer land it (SPEC §3.5b)."""
        since: datetime = effect.updated_at
        if effect.attempt_id != binding.attempt_id:
            earlier = await self._store.attempt(effect.attempt_id)
            if earlier is not None and earlier.lease_until is not None:
                since = max(since, earlier.lease_until)
        settled_at = since + timedelta(seconds=rule.timeout_s)
        wait = (settled_at - self._clock.now()).total_seconds()
        if wait <= 0:
            return
        if wait > SETTLE_WAIT_MAX_S:
            raise EffectSettling(
                f"task {binding.task}: attempt {effect.attempt_id} could still land "
                f"{effect.key!r} until {settled_at.isoformat()}; it is checked after that",
                retry_after_s=wait,
            )
        log.info(
            "waiting %.1fs for an earlier attempt's request to settle",
            wait,
            extra=_fields(binding, rule) | {"effect_key": effect.key},
        )
        await asyncio.sleep(wait)

    async def _probe(self, match: RuleMatch, request: AgentRequest) -> RecordedResponse | None:
        rule = match.rule
        spec = rule.probe
        assert spec is not None  # the rule model requires a probe for on_unknown: probe
        facts = request.facts
        try:
            target = spec.request.path.render(facts, match.params)
            extra = {n: t.render(facts, match.params) for n, t in spec.request.headers.items()}
        except TemplateValueMissing as missing:
            raise ProbeFailed(f"rule {rule.name}: cannot build the probe: {missing}") from missing
        host = spec.request.host or facts.host
        url = self._upstream.url(request.scheme, host, facts.port, target)
        # The agent's own credentials authorise the probe, as they did the request.
        skip = {"content-type", "content-encoding", "content-length"}
        if rule.idempotency_header:
            skip.add(rule.idempotency_header.lower())
        headers = [(n, v) for n, v in request.headers if n.lower() not in skip]
        headers += list(extra.items())
        try:
            reply = await self._upstream.send(
                spec.request.method, url, headers, None, timeout_s=rule.timeout_s
            )
        except UpstreamError as error:
            raise ProbeFailed(f"rule {rule.name}: probe {url} failed: {error}") from error
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
            spec.answer.status,
            (("Content-Type", "application/json"),),
            json.dumps(body).encode(),
        )

    async def _complete_from_evidence(
        self, binding: Binding, rule: Rule, effect: Effect, evidence: RecordedResponse
    ) -> Answer:
        completed = await self._durably(
            lambda: self._store.transition_effect(
                binding.task,
                effect.key,
                binding.attempt_id,
                binding.generation,
                EffectState.COMPLETED,
                response=evidence,
                detail="completed from probe evidence",
            )
        )
        self._remember(completed)
        self._note_later(binding, effect, "probed", "found in the outside world")
        await self._checkpoint(binding, rule, evidence)
        log.info("effect probed: found", extra=_fields(binding, rule) | {"effect_key": effect.key})
        headers = (*evidence.headers, ("X-Sidecar-Effect", "probed"))
        return Answer(evidence.status, headers, evidence.body, "probed")

    async def _retry(
        self,
        binding: Binding,
        match: RuleMatch,
        request: AgentRequest,
        effect: Effect,
        disposition: str,
    ) -> Answer:
        time_left = await self._bindings.with_time_left(binding)
        effect = await self._durably(
            lambda: self._store.transition_effect(
                binding.task,
                effect.key,
                binding.attempt_id,
                binding.generation,
                EffectState.PENDING,
                detail="sent again with the first idempotency key",
            )
        )
        return await self._forward(binding, match, request, effect, time_left, disposition)

    # ---- forwarding and recording -----------------------------------------------------

    async def _forward(
        self,
        binding: Binding,
        match: RuleMatch,
        request: AgentRequest,
        effect: Effect,
        time_left: timedelta,
        disposition: str,
    ) -> Answer:
        rule = match.rule
        facts = request.facts
        headers = list(request.headers)
        if rule.idempotency_header and effect.idempotency_key:
            name = rule.idempotency_header.lower()
            # Ours replaces any the client made up: an SDK mints a new one per retry.
            headers = [(n, v) for n, v in headers if n.lower() != name]
            headers.append((rule.idempotency_header, effect.idempotency_key))
        url = self._upstream.url(request.scheme, facts.host, facts.port, request.target)
        # Never wait for an answer past the lease: after it, another attempt may probe.
        timeout = max(0.001, min(rule.timeout_s, time_left.total_seconds()))
        try:
            reply = await self._upstream.send(
                facts.method, url, headers, request.body or None, timeout_s=timeout
            )
        except UpstreamError as error:
            await self._best_effort_unknown(binding, effect, str(error))
            raise UpstreamFailed(
                f"task {binding.task}: {error}; the outcome of {effect.key!r} is unknown and "
                "will be checked before it is sent again",
                timeout=error.timeout,
            ) from error
        failpoints.reach("effect.after_upstream")
        state = _classify(rule.effect, reply.status)
        recorded = RecordedResponse(
            reply.status, recordable_response_headers(reply.headers), reply.body
        )
        final = await self._durably(
            lambda: self._store.transition_effect(
                binding.task,
                effect.key,
                binding.attempt_id,
                binding.generation,
                state,
                response=recorded,
                detail=f"upstream answered {reply.status}",
            )
        )
        failpoints.reach("effect.after_record")
        if state is EffectState.COMPLETED:
            self._remember(final)
            await self._checkpoint(binding, rule, recorded)
        log.info(
            "effect %s: upstream %s",
            state.value,
            reply.status,
            extra=_fields(binding, rule) | {"effect_key": effect.key},
        )
        return _live_answer(reply, disposition, state)

    async def _best_effort_unknown(self, binding: Binding, effect: Effect, why: str) -> None:
        try:
            await self._store.transition_effect(
                binding.task,
                effect.key,
                binding.attempt_id,
                binding.generation,
                EffectState.UNKNOWN,
                detail=why,
            )
        except SidecarError as error:
            # Still pending in the log, which a later attempt treats as unknown anyway.
            log.warning("could not mark %s unknown: %s", effect.key, error.detail)

    async def _checkpoint(self, binding: Binding, rule: Rule, response: RecordedResponse) -> None:
        spec = rule.checkpoint
        if spec is None:
            return
        try:
            data = json.loads(response.body) if response.body else None
        except ValueError:
            data = None
        outputs = {name: expr.search(data) for name, expr in spec.outputs.items()}
        try:
            await self._durably(
                lambda: self._store.append_checkpoint(
                    binding.task, binding.attempt_id, binding.generation, spec.stage, outputs
                )
            )
        except SidecarError as error:
            # The effect itself is recorded; the stage marker can be written again later.
            log.warning("checkpoint %s not written: %s", spec.stage, error.detail)

    def _note_later(self, binding: Binding, effect: Effect, event: str, detail: str | None) -> None:
        # One audit line per attempt, effect and kind of event says who replayed what; an
        # agent retrying a call in a loop must not turn into a write per retry.
        seen = (binding.attempt_id, effect.task, effect.key, event, detail)
        if seen in self._noted:
            return
        if len(self._noted) >= NOTED_MAX:
            self._noted.clear()
        self._noted.add(seen)

        async def write() -> None:
            try:
                await self._durably(
                    lambda: self._store.note_effect(
                        binding.task,
                        effect.key,
                        binding.attempt_id,
                        binding.generation,
                        event,
                        detail,
                    )
                )
            except SidecarError as error:
                log.warning("audit line %s for %s not written: %s", event, effect.key, error.detail)

        spawn(write(), name=f"note:{binding.task}:{event}")

    async def _durably[T](self, write: Callable[[], Awaitable[T]]) -> T:
        """Run a store write, retrying an unavailable store with backoff and jitter."""
        deadline = asyncio.get_running_loop().time() + self._store_retry_s
        delay = 0.05
        while True:
            try:
                return await write()
            except StoreUnavailable:
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise
                await asyncio.sleep(delay * random.uniform(0.5, 1.5))  # noqa: S311
                delay = min(delay * 2, 0.5)


def _live_answer(reply: Reply, disposition: str, state: EffectState) -> Answer:
    kept = [
        (n, v)
        for n, v in reply.headers
        if n.lower() not in {"connection", "keep-alive", "transfer-encoding", "content-length"}
    ]
    kept.append(("X-Sidecar-Effect", disposition))
    kept.append(("X-Sidecar-Effect-State", state.value))
    return Answer(reply.status, tuple(kept), reply.body, disposition)


def _fields(binding: Binding | None, rule: Rule) -> dict[str, object]:
    if binding is None:
        return {"rule": rule.name}
    return {
        "task": binding.task,
        "attempt_id": binding.attempt_id,
        "generation": binding.generation,
        "rule": rule.name,
    }
