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
``store_unavailable``) and nothing is forwarded: the sidecar fails closed.  What depends
on the protocol (naming, replaying, judging and probing an effect) is a codec's job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sidecar import failpoints
from sidecar.aio import spawn
from sidecar.clock import Clock
from sidecar.domain.ids import idempotency_key
from sidecar.domain.model import Effect, EffectState, RecordedResponse
from sidecar.domain.text import scrubbed, scrubbed_text, text_problem
from sidecar.errors import (
    EffectExists,
    EffectSettling,
    EffectUnknown,
    InvalidRequest,
    PayloadMismatch,
    PayloadTooLarge,
    SidecarError,
    SidecarFault,
    StaleGeneration,
    StoreUnavailable,
    TaskUnbound,
    UpstreamFailed,
)
from sidecar.metrics import Metrics
from sidecar.proxy.bindings import Binding, Bindings
from sidecar.proxy.codecs import Codec, Content, Described, GitPushCodec, HttpCodec, codec_for
from sidecar.proxy.exchange import AgentRequest, Answer, Sender, refusal, unsendable_header
from sidecar.proxy.redact import recordable_response_headers, request_summary
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.rules import EffectKind, OnDivergence, OnUnknown, RuleMatch, RuleSet
from sidecar.rules.matcher import HttpRequestFacts
from sidecar.rules.model import Rule
from sidecar.store import Store

log = logging.getLogger("sidecar.effects")

SETTLE_WAIT_MAX_S = 30.0
# How long a lease release waits for the attempt's forwards still in flight: each ends by
# its own upstream timeout (at most the rule's timeout_s), then its outcome is recorded.
RELEASE_WAIT_MAX_S = 60.0
COMPLETED_CACHE = 4096  # completed effects kept in memory for replays
NOTED_MAX = 65536  # (attempt, effect, event) audit lines remembered as already written


@dataclass(frozen=True, slots=True)
class Call:
    """One matched request on its way through the flow."""

    binding: Binding
    match: RuleMatch
    request: AgentRequest
    described: Described
    codec: Codec

    @property
    def rule(self) -> Rule:
        return self.match.rule

    @property
    def fields(self) -> dict[str, object]:
        return _fields(self.binding, self.rule) | {"effect_key": self.described.key}


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
        self._bindings = bindings
        self._upstream = upstream
        self._clock = clock
        self._metrics = metrics
        self._store_retry_s = store_retry_s
        self._http = HttpCodec(rules)
        self._git = GitPushCodec()
        self._in_flight: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._completed: OrderedDict[tuple[str, str], Effect] = OrderedDict()
        self._noted: set[tuple[str, str, str, str, str | None]] = set()
        # (task, attempt) -> its forwards in flight, which a release of its lease waits for.
        self._forwarding: dict[tuple[str, str], set[asyncio.Future[None]]] = {}

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
        except Exception as unexpected:  # SPEC §3.6: every failure is answered
            answer = refusal(fault(unexpected, rule))
            log.exception("effect path failed", extra=_fields(binding, rule))
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
        if (why := unsendable_header(request.headers)) is not None:
            raise InvalidRequest(f"{why}: the request cannot be forwarded, nothing was recorded")
        codec = codec_for(rule, self._http, self._git)
        call = Call(binding, match, request, codec.describe(match, request), codec)
        if (why := text_problem(call.described.key)) is not None:
            raise InvalidRequest(
                f"rule {rule.name} keys this request as {call.described.key!r}: {why}; "
                "nothing was recorded or forwarded"
            )
        slot = (binding.task, call.described.key)
        while True:
            if (running := self._in_flight.get(slot)) is not None:
                # The same effect is being forwarded right now by this sidecar: wait for its
                # outcome instead of sending it a second time.
                await asyncio.shield(running)
                continue
            if (known := self._completed.get(slot)) is not None:
                return self._replay(call, known)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._in_flight[slot] = done
            try:
                return await self._first_try(call)
            finally:
                del self._in_flight[slot]
                done.set_result(None)

    # ---- the effect was never seen --------------------------------------------------

    async def _first_try(self, call: Call) -> Answer:
        # Try to log the effect straight away: a new effect needs nothing more, and one
        # already logged comes back with the refusal - one store round trip either way.
        try:
            time_left = await self._bindings.with_time_left(call.binding)  # self-fencing
        except StaleGeneration as fenced:
            self.keep_refusal(fenced, call.request.facts, call.rule)
            raise
        request, facts, binding = call.request, call.request.facts, call.binding
        summary = request_summary(
            facts.method,
            request.scheme,
            facts.host if facts.port is None else f"{facts.host}:{facts.port}",
            facts.path,
            request.target.partition("?")[2],
            request.headers,
            None if call.described.push is not None else request.body,
        )
        try:
            effect = await self._durably(
                lambda: self._store.record_pending(
                    binding.task,
                    call.described.key,
                    binding.attempt_id,
                    binding.generation,
                    kind="git" if call.described.push is not None else "http",
                    rule=call.rule.name,
                    fingerprint=call.described.fingerprint,
                    idempotency_key=idempotency_key(binding.attempt_id, call.described.key),
                    request=scrubbed(summary | call.described.summary),
                )
            )
        except EffectExists as logged:
            return await self._again(call, logged.existing)
        failpoints.reach("effect.after_pending", call.rule.name)
        return await self._forward(call, effect, time_left, "recorded")

    # ---- the effect is in the log -----------------------------------------------------

    async def _again(self, call: Call, effect: Effect) -> Answer:
        if effect.state is EffectState.COMPLETED:
            self._remember(effect)
            return self._replay(call, effect)
        if effect.state is EffectState.PENDING:
            # Pending, yet not in flight in this sidecar: whoever sent it died (or a stale
            # worker is still waiting for its answer). Its outcome is unknown.
            effect = await self._transition(
                call, effect, EffectState.UNKNOWN, "found pending with no live request here"
            )
        if call.rule.effect is EffectKind.CACHE or effect.state is EffectState.FAILED:
            # A model call is safe to ask again; a definitive failure changed nothing.
            return await self._retry(call, effect)
        return await self._resolve_unknown(call, effect)

    def _replay(self, call: Call, effect: Effect) -> Answer:
        """Answer from the log.  Nothing is forwarded, so the audit line need not be durable
        before the answer: it is written in the background (and logged if it cannot be)."""
        divergent = effect.fingerprint != call.described.fingerprint
        if divergent and call.rule.on_divergence is OnDivergence.REJECT:
            self._note_later(call.binding, effect, "divergent", "rejected: payload differs")
            rejected = call.codec.reject(effect, call.described)
            if rejected is None:
                raise PayloadMismatch(
                    f"task {call.binding.task}: effect {effect.key!r} was already performed "
                    "with a different payload (rule on_divergence: reject)"
                )
            return _answer(rejected, "refused")
        detail = "payload differs from the recorded one" if divergent else None
        self._note_later(call.binding, effect, "replayed", detail)
        content = call.codec.replay(effect, call.described)
        extra = [("X-Sidecar-Effect", "replayed"), ("Idempotent-Replayed", "true")]
        if divergent:
            extra.append(("X-Sidecar-Divergent", "true"))
        log.info("effect replayed", extra=call.fields)
        return Answer(content.status, (*content.headers, *extra), content.body, "replayed")

    def _remember(self, effect: Effect) -> None:
        """Keep a completed effect at hand: completed is final, so the copy never goes stale."""
        slot = (effect.task, effect.key)
        self._completed[slot] = effect
        self._completed.move_to_end(slot)
        while len(self._completed) > COMPLETED_CACHE:
            self._completed.popitem(last=False)

    async def _resolve_unknown(self, call: Call, effect: Effect) -> Answer:
        rule = call.rule
        if rule.on_unknown is OnUnknown.BLOCK:
            raise EffectUnknown(
                call.binding.task,
                effect.key,
                f"task {call.binding.task}: the outcome of {effect.key!r} (attempt "
                f"{effect.attempt_id}) is unknown and rule {rule.name} has no probe and no "
                "safe retry: CANNOT DETERMINE - a human must check the outside world "
                f"(see `sidecar effects {call.binding.task}`)",
            )
        if rule.on_unknown is OnUnknown.PROBE:
            # (A retry needs no settling: the API dedupes on the idempotency key we resend.)
            await self._settle(call, effect)
            evidence = await call.codec.probe(
                self._upstream, call.match, call.request, effect, call.described
            )
            if evidence is not None:
                return await self._complete_from_evidence(call, effect, evidence)
        return await self._retry(call, effect)

    async def _settle(self, call: Call, effect: Effect) -> None:
        """Wait until whoever left the effect unresolved can no longer land it (SPEC §3.5b)."""
        since: datetime = effect.updated_at
        if effect.attempt_id != call.binding.attempt_id:
            earlier = await self._store.attempt(effect.attempt_id)
            if earlier is not None and earlier.lease_until is not None:
                since = max(since, earlier.lease_until)
        settled_at = since + timedelta(seconds=call.rule.timeout_s)
        wait = (settled_at - self._clock.now()).total_seconds()
        if wait <= 0:
            return
        if wait > SETTLE_WAIT_MAX_S:
            raise EffectSettling(
                f"task {call.binding.task}: attempt {effect.attempt_id} could still land "
                f"{effect.key!r} until {settled_at.isoformat()}; it is checked after that",
                retry_after_s=wait,
            )
        log.info("waiting %.1fs for an earlier request to settle", wait, extra=call.fields)
        await asyncio.sleep(wait)

    async def _complete_from_evidence(
        self, call: Call, effect: Effect, evidence: RecordedResponse
    ) -> Answer:
        completed = await self._durably(
            lambda: self._store.transition_effect(
                call.binding.task,
                effect.key,
                call.binding.attempt_id,
                call.binding.generation,
                EffectState.COMPLETED,
                response=evidence,
                detail="completed from evidence in the outside world",
            )
        )
        self._remember(completed)
        self._note_later(call.binding, effect, "probed", "found in the outside world")
        await self._checkpoint(call, evidence)
        log.info("effect found by probe", extra=call.fields)
        return _answer(call.codec.replay(completed, call.described), "probed")

    async def _retry(self, call: Call, effect: Effect) -> Answer:
        time_left = await self._bindings.with_time_left(call.binding)
        effect = await self._transition(
            call, effect, EffectState.PENDING, "sent again with the first idempotency key"
        )
        return await self._forward(call, effect, time_left, "recorded")

    # ---- forwarding and recording -----------------------------------------------------

    async def settle_attempt(
        self, task: str, attempt_id: str, timeout_s: float = RELEASE_WAIT_MAX_S
    ) -> None:
        """Wait (bounded) until the attempt's forwards in flight have their outcomes
        recorded: a release waits for them, so the next attempt finds the answer the
        upstream gave rather than a pending effect it must guess about (SPEC §3.7)."""
        waiting = self._forwarding.get((task, attempt_id))
        if waiting:
            log.info(
                "release waits for %d forward(s) in flight",
                len(waiting),
                extra={"task": task, "attempt_id": attempt_id},
            )
            await asyncio.wait(list(waiting), timeout=timeout_s)

    async def _forward(
        self, call: Call, effect: Effect, time_left: timedelta, disposition: str
    ) -> Answer:
        slot = (call.binding.task, call.binding.attempt_id)
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._forwarding.setdefault(slot, set()).add(finished)
        try:
            return await self._forward_and_record(call, effect, time_left, disposition)
        finally:
            finished.set_result(None)
            waiting = self._forwarding[slot]
            waiting.discard(finished)
            if not waiting:
                del self._forwarding[slot]

    async def _forward_and_record(
        self, call: Call, effect: Effect, time_left: timedelta, disposition: str
    ) -> Answer:
        rule, request, facts = call.rule, call.request, call.request.facts
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
            if not error.sent:
                # Nothing reached the upstream: a definitive failure, so the next request
                # for this effect simply sends it (no probe, no block for a human).
                await self._best_effort(call, effect, EffectState.FAILED, str(error))
                raise UpstreamFailed(
                    f"task {call.binding.task}: {error}; nothing was sent, a retry sends "
                    f"{effect.key!r}"
                ) from error
            await self._best_effort(call, effect, EffectState.UNKNOWN, str(error))
            raise UpstreamFailed(
                f"task {call.binding.task}: {error}; the outcome of {effect.key!r} is unknown "
                "and will be checked before it is sent again",
                timeout=error.timeout,
            ) from error
        failpoints.reach("effect.after_upstream", rule.name)
        if call.codec.already_exists(rule, reply):
            # The upstream says an earlier attempt already made it: fetch it, answer it.
            evidence = await call.codec.probe(
                self._upstream, call.match, request, effect, call.described
            )
            if evidence is not None:
                return await self._complete_from_evidence(call, effect, evidence)
        state = call.codec.classify(rule, reply)
        recorded = RecordedResponse(
            reply.status, recordable_response_headers(reply.headers), reply.body
        )
        final = await self._transition(
            call, effect, state, f"upstream answered {reply.status}", recorded
        )
        failpoints.reach("effect.after_record", rule.name)
        if state is EffectState.COMPLETED:
            self._remember(final)
            await self._checkpoint(call, recorded)
        log.info("effect %s: upstream %s", state.value, reply.status, extra=call.fields)
        return _live_answer(reply, disposition, state)

    async def _transition(
        self,
        call: Call,
        effect: Effect,
        to: EffectState,
        detail: str,
        response: RecordedResponse | None = None,
    ) -> Effect:
        binding = call.binding
        return await self._durably(
            lambda: self._store.transition_effect(
                binding.task,
                effect.key,
                binding.attempt_id,
                binding.generation,
                to,
                response=response,
                detail=detail,
            )
        )

    async def _best_effort(self, call: Call, effect: Effect, to: EffectState, why: str) -> None:
        try:
            await self._transition(call, effect, to, why)
        except SidecarError as error:
            # Still pending in the log, which a later attempt treats as unknown anyway:
            # the safe reading of either outcome.
            log.warning("could not mark %s %s: %s", effect.key, to.value, error.detail)

    async def _checkpoint(self, call: Call, response: RecordedResponse) -> None:
        spec = call.rule.checkpoint
        if spec is None:
            return
        try:
            data = json.loads(response.body) if response.body else None
        except ValueError:
            data = None
        outputs = {name: expr.search(data) for name, expr in spec.outputs.items()}
        binding = call.binding
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

    def keep_refusal(self, fenced: StaleGeneration, facts: HttpRequestFacts, rule: Rule) -> None:
        """Log in the store, in the background, a request fenced before it reached the
        store, so the audit trail shows every refused write, not only the store's own."""
        self._metrics.stale_writes_refused.labels("proxy").inc()
        reason = f"{facts.method} {facts.host}{facts.path} (rule {rule.name}): {fenced.reason}"
        reason = scrubbed_text(reason)  # a path may carry bytes UTF-8 cannot encode

        async def write() -> None:
            try:
                await self._durably(lambda: self._store.note_refusal(fenced, reason))
            except SidecarError as error:
                log.warning("refusal of %s not kept: %s", fenced.attempt_id, error.detail)

        spawn(write(), name=f"refusal:{fenced.task}")

    async def _durably[T](self, write: Callable[[], Awaitable[T]]) -> T:
        """Run a store write, retrying an unavailable store with backoff and jitter for
        ``store_retry_s``: the last try is made at the deadline, not a backoff step before
        it, so a refusal always comes after the whole bound."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._store_retry_s
        delay = 0.05
        while True:
            try:
                return await write()
            except StoreUnavailable:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, delay * random.uniform(0.5, 1.5)))  # noqa: S311
                delay = min(delay * 2, 0.5)


def fault(unexpected: BaseException, rule: Rule) -> SidecarFault:
    """The answer for an exception nobody meant to raise (its type and text, no trace)."""
    return SidecarFault(
        f"rule {rule.name}: {type(unexpected).__name__}: {unexpected}; nothing was forwarded "
        "that was not recorded first (an effect left pending is checked before it is sent again)"
    )


def _answer(content: Content, disposition: str) -> Answer:
    headers = (*content.headers, ("X-Sidecar-Effect", disposition))
    return Answer(content.status, headers, content.body, disposition)


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
