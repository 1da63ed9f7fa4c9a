"""The effect flow of SPEC §3 for one matched request, free of mitmproxy types.

Check the log first, then record the outcome - around every intercepted effect:

    fenced?  ──yes──▶ 409 stale_generation (bindings)            nothing forwarded
    in flight here? ─▶ wait for it, then look again               never sent twice
    completed ──────▶ replay the recorded answer                  X-Sidecar-Effect: replayed
    pending/unknown ▶ probe (found: done) | prove absence, then send again | block
    failed ─────────▶ forward again, same idempotency key
    none ───────────▶ record pending (durable) → forward → record answer → answer

A first try whose answer is late is answered 504 at the rule's ``timeout_s``, but its
connection is kept (``settle_s`` longer) and its answer still recorded; a probe's "not
found" is proof of absence only once that connection has ended and ``settle_s`` more has
passed (SPEC §3.8).  Without that proof and without an idempotency key the effect is not
sent again: the agent is told to come back (503 ``effect_settling``).

The store is written *before* anything is forwarded and *before* anything is answered; if
it cannot be written within a bounded retry, the request is refused (503
``store_unavailable``) and nothing is forwarded: the sidecar fails closed.  What depends
on the protocol (naming, replaying, judging and probing an effect) is a codec's job.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from yarl import URL

from sidecar.domain.effects import abandonment, absence_proven_at
from sidecar.domain.ids import idempotency_key
from sidecar.domain.model import Effect, EffectState, RecordedResponse
from sidecar.domain.text import scrubbed, text_problem
from sidecar.errors import (
    EffectExists,
    EffectSettling,
    EffectUnknown,
    InvalidRequest,
    PayloadMismatch,
    PayloadTooLarge,
    SidecarError,
    SidecarFault,
    TaskUnbound,
    UpstreamFailed,
)
from sidecar.proxy.codecs import Codec, Content, Described, GitPushCodec, HttpCodec, codec_for
from sidecar.proxy.exchange import (
    AgentRequest,
    Answer,
    Sender,
    refusal,
    unsendable_header,
    unsendable_target,
)
from sidecar.proxy.redact import (
    body_digest_off_loop,
    recordable_response_headers,
    redact_response,
    request_summary,
    without_secrets,
)
from sidecar.proxy.upstream import Reply, UpstreamError
from sidecar.recording.bindings import Binding, Bindings
from sidecar.recording.recorder import Recorder
from sidecar.rules import EffectKind, OnDivergence, OnUnknown, RuleMatch
from sidecar.rules.model import Rule
from sidecar.runtime import failpoints
from sidecar.runtime.aio import spawn
from sidecar.runtime.clock import Clock
from sidecar.runtime.metrics import Metrics
from sidecar.store import Store
from sidecar.store.observed import Announce

log = logging.getLogger("sidecar.effects")

SETTLE_WAIT_MAX_S = 30.0
# How long a lease release waits for the attempt's forwards still in flight: each ends by
# its own upstream timeout (at most the rule's timeout_s), then its outcome is recorded.
RELEASE_WAIT_MAX_S = 60.0
COMPLETED_CACHE = 4096  # completed effects kept in memory for replays
NOTED_MAX = 65536  # (attempt, effect, event) audit lines remembered as already written
ENDED_MAX = 65536  # when first tries' connections ended, for proofs of absence


#: What a replayed answer carries besides the recorded one's header fields.
_REPLAY = (("X-Sidecar-Effect", "replayed"), ("Idempotent-Replayed", "true"))
_DIVERGENT_REPLAY = (*_REPLAY, ("X-Sidecar-Divergent", "true"))


@dataclass(frozen=True, slots=True)
class Call:
    """One matched request on its way through the flow."""

    binding: Binding
    match: RuleMatch
    request: AgentRequest
    described: Described
    codec: Codec
    #: the body's sha256 for its summary, hashed off the loop meanwhile (a large body).
    body_sha256: asyncio.Future[str] | None = None

    @property
    def rule(self) -> Rule:
        return self.match.rule

    @property
    def what(self) -> str:
        """The request as a refusal in the audit trail names it."""
        facts = self.request.facts
        return f"{facts.method} {facts.host}{self.shown(facts.path)} (rule {self.rule.name})"

    def shown(self, text: str) -> str:
        """``text`` fit for the effect log and the logs: the rule's secret parameters out."""
        return without_secrets(text, self.match.secrets)

    def kept(self, response: RecordedResponse) -> RecordedResponse:
        """``response`` as the effect log keeps it: the fields the rule names redacted."""
        return redact_response(response, self.rule.redact.response)

    @property
    def fields(self) -> dict[str, object]:
        return _fields(self.binding, self.rule) | {"effect_key": self.described.key}


class EffectGuard:
    def __init__(
        self,
        store: Store,
        bindings: Bindings,
        upstream: Sender,
        clock: Clock,
        metrics: Metrics,
        *,
        store_retry_s: float = 2.0,
        announce: Announce | None = None,
    ) -> None:
        self._recorder = Recorder(store, bindings, metrics, store_retry_s=store_retry_s)
        self._announce = announce
        self._store = store
        self._upstream = upstream
        self._clock = clock
        self._metrics = metrics
        self._http = HttpCodec()
        self._git = GitPushCodec()
        self._in_flight: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._completed: OrderedDict[tuple[str, str], Effect] = OrderedDict()
        self._noted: set[tuple[str, str, str, str, str | None]] = set()
        # (task, attempt) -> its forwards in flight, which a release of its lease waits for.
        self._forwarding: dict[tuple[str, str], set[asyncio.Future[None]]] = {}
        # (task, effect) -> a first try answered late to the agent, whose connection is
        # kept to record its answer; and when such connections ended (SPEC §3.8).
        self._lingering: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._ended: OrderedDict[tuple[str, str], datetime] = OrderedDict()

    @property
    def recorder(self) -> Recorder:
        """The effect-recording layer (binding, fencing, durable writes) it runs on."""
        return self._recorder

    async def handle(
        self, binding: Binding | None, match: RuleMatch, request: AgentRequest
    ) -> Answer:
        rule = match.rule
        try:
            answer = await self._handle(binding, match, request)
        except SidecarError as error:
            self._metrics.refusals.labels(error.code).inc()
            # Details quote the request's URL, which may carry a secret the rule marks.
            error.detail = without_secrets(error.detail, match.secrets)
            answer = refusal(error)
            log.warning(
                "effect refused: %s",
                error.detail,
                extra=_fields(binding, rule) | {"code": error.code},
            )
        except Exception as unexpected:  # SPEC §3.6: every failure is answered
            failed = fault(unexpected, rule)
            failed.detail = without_secrets(failed.detail, match.secrets)
            answer = refusal(failed)
            _log_fault(match, failed, binding)
        self._metrics.effects_by(rule.name, answer.disposition).inc()
        return answer

    async def _handle(
        self, binding: Binding | None, match: RuleMatch, request: AgentRequest
    ) -> Answer:
        rule = match.rule
        if binding is None:
            raise TaskUnbound(  # the URL's secrets are taken out by handle()
                f"{request.facts.method} {request.facts.host}{request.facts.path} is a side "
                f"effect (rule {rule.name}) but no task is bound: run the agent under "
                "`sidecar exec --task TASK`, or send X-Sidecar-Task"
            )
        if len(request.body) > rule.max_body_bytes:
            raise PayloadTooLarge(
                f"rule {rule.name} records bodies up to {rule.max_body_bytes} bytes; "
                f"this one has {len(request.body)}"
            )
        why = unsendable_target(request.target) or unsendable_header(request.headers)
        if why is not None:
            raise InvalidRequest(f"{why}: the request cannot be forwarded, nothing was recorded")
        codec = codec_for(rule, self._http, self._git)
        # Started first, so that a large body is hashed while its fingerprint is made.
        digest = body_digest_off_loop(request.body) if codec is self._http else None
        call = Call(binding, match, request, codec.describe(match, request), codec, digest)
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
        # Self-fencing at admission: refused before anything is recorded.
        await self._recorder.admit(call.binding, call.what, "proxy")
        request, facts, binding = call.request, call.request.facts, call.binding
        summary = request_summary(
            facts.method,
            request.scheme,
            facts.host if facts.port is None else f"{facts.host}:{facts.port}",
            call.shown(facts.path),
            request.target.partition("?")[2],
            request.headers,
            None if call.described.push is not None else request.body,
            parsed=facts.json_body(),  # parsed once already, for the fingerprint
            body_sha256=None if call.body_sha256 is None else await call.body_sha256,
        )
        failpoints.reach("effect.before_pending", call.rule.name)
        try:
            effect = await self._recorder.durably(
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
        return await self._forward(call, effect, "recorded")

    # ---- the effect is in the log -----------------------------------------------------

    async def _again(self, call: Call, effect: Effect) -> Answer:
        if (abandoned := abandonment(effect)) is not None:
            raise abandoned  # a human said it must not happen (SPEC §3.10)
        if effect.state in (EffectState.PENDING, EffectState.UNKNOWN):
            effect = await self._first_try_outcome(call, effect)
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
        divergent = call.codec.diverges(effect, call.described, call.request)
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
        extra = _DIVERGENT_REPLAY if divergent else _REPLAY
        if log.isEnabledFor(logging.INFO):  # its fields are a dict made for the line
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
            blocked = EffectUnknown(
                call.binding.task,
                effect.key,
                f"task {call.binding.task}: the outcome of {effect.key!r} (attempt "
                f"{effect.attempt_id}) is unknown and rule {rule.name} has no probe and no "
                "safe retry: CANNOT DETERMINE - a human must check the outside world "
                f"(see `sidecar effects {call.binding.task}`), then settle it with `sidecar "
                f"effects resolve {call.binding.task} KEY --as completed|failed|abandoned`",
            )
            # One audit line (and one notification) per attempt refused: how long it
            # waited for a human shows.
            first = self._note_later(
                call.binding, effect, "blocked", "refused: CANNOT DETERMINE, waits for a human"
            )
            if first and self._announce is not None:
                self._announce(
                    "effect_blocked",
                    {
                        "task": call.binding.task,
                        "effect_key": effect.key,
                        "rule": rule.name,
                        "attempt_id": call.binding.attempt_id,
                        "generation": call.binding.generation,
                        "detail": blocked.detail,
                    },
                )
            raise blocked
        if rule.on_unknown is OnUnknown.PROBE:
            evidence = await self._probe(call, effect)
            if evidence is not None:
                return await self._complete_from_evidence(call, effect, evidence)
            # "Not found" may only mean "not yet": send again only once the first try can
            # no longer land (with an idempotency key a retry would be safe anyway); if
            # that meant waiting, look once more.
            if rule.idempotency_header is None and await self._prove_absence(call, effect):
                evidence = await self._probe(call, effect)
                if evidence is not None:
                    return await self._complete_from_evidence(call, effect, evidence)
        return await self._retry(call, effect)

    async def _probe(self, call: Call, effect: Effect) -> RecordedResponse | None:
        return await call.codec.probe(
            self._upstream, call.match, call.request, effect, call.described
        )

    async def _first_try_outcome(self, call: Call, effect: Effect) -> Effect:
        """If this sidecar still holds the first try's connection, wait for its answer
        (bounded) and return the effect as that answer left it."""
        slot = (call.binding.task, effect.key)
        lingering = self._lingering.get(slot)
        if lingering is None:
            return effect
        log.info("waiting for the first try's answer", extra=call.fields)
        done, _ = await asyncio.wait({lingering}, timeout=SETTLE_WAIT_MAX_S)
        if not done:
            raise EffectSettling(
                f"task {call.binding.task}: the first try of {effect.key!r} is still waiting "
                "for the upstream's answer; it is recorded when it comes",
                retry_after_s=SETTLE_WAIT_MAX_S,
            )
        now = await self._store.effect(call.binding.task, effect.key)
        return effect if now is None else now

    async def _prove_absence(self, call: Call, effect: Effect) -> bool:
        """Wait until a probe's "not found" proves absence (SPEC §3.5b, §3.8): whoever sent
        the effect can no longer land it and the API has had ``settle_s`` to finish.
        Whether it had to wait (then the probe must be made again).

        The first try's connection ended when this sidecar saw it end; otherwise (another
        process sent it) no connection of a sidecar outlives ``timeout_s + settle_s`` after
        the effect was last written, nor an earlier attempt's lease by ``timeout_s``."""
        rule = call.rule
        lease_until = None
        if effect.attempt_id != call.binding.attempt_id:
            earlier = await self._store.attempt(effect.attempt_id)
            lease_until = earlier.lease_until if earlier is not None else None
        proven_at = absence_proven_at(
            effect.updated_at,
            rule.timeout_s,
            rule.settle_s,
            first_try_ended=self._ended.get((call.binding.task, effect.key)),
            lease_until=lease_until,
        )
        wait = (proven_at - self._clock.now()).total_seconds()
        if wait <= 0:
            return False
        if wait > SETTLE_WAIT_MAX_S:
            raise EffectSettling(
                f"task {call.binding.task}: {effect.key!r} was not found, but its first try "
                f"could still land until {proven_at.isoformat()} (rule {rule.name}: "
                f"timeout_s {rule.timeout_s:g}, settle_s {rule.settle_s:g}); it is checked "
                "again after that, and sent again only if it is still not found",
                retry_after_s=wait,
            )
        log.info("waiting %.1fs before absence is proven", wait, extra=call.fields)
        await asyncio.sleep(wait)
        return True

    async def _complete_from_evidence(
        self, call: Call, effect: Effect, evidence: RecordedResponse
    ) -> Answer:
        completed = await self._recorder.durably(
            lambda: self._store.transition_effect(
                call.binding.task,
                effect.key,
                call.binding.attempt_id,
                call.binding.generation,
                EffectState.COMPLETED,
                response=call.kept(evidence),
                detail="completed from evidence in the outside world",
            )
        )
        self._remember(completed)
        self._note_later(call.binding, effect, "probed", "found in the outside world")
        await self._checkpoint(call, call.kept(evidence))
        log.info("effect found by probe", extra=call.fields)
        return _answer(call.codec.replay(completed, call.described), "probed")

    async def _retry(self, call: Call, effect: Effect) -> Answer:
        await self._recorder.admit(call.binding, call.what, "proxy")  # before it is reopened
        if call.rule.idempotency_header and effect.idempotency_key:
            why = f"sent again with the first idempotency key ({call.rule.idempotency_header})"
        elif effect.state is EffectState.FAILED:
            why = "sent again: the first try failed definitively"
        elif call.rule.effect is EffectKind.CACHE:
            why = "asked again: a model call is safe to repeat"
        elif call.rule.on_unknown is OnUnknown.RETRY:
            why = "sent again: the rule declares a retry safe (on_unknown: retry)"
        else:
            why = "sent again: the probe proved it absent after the first try settled"
        effect = await self._transition(call, effect, EffectState.PENDING, why)
        return await self._forward(call, effect, "recorded")

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

    async def _forward(self, call: Call, effect: Effect, disposition: str) -> Answer:
        slot = (call.binding.task, call.binding.attempt_id)
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._forwarding.setdefault(slot, set()).add(finished)
        try:
            return await self._forward_and_record(call, effect, disposition)
        finally:
            finished.set_result(None)
            waiting = self._forwarding[slot]
            waiting.discard(finished)
            if not waiting:
                del self._forwarding[slot]

    async def _forward_and_record(self, call: Call, effect: Effect, disposition: str) -> Answer:
        rule, request, facts = call.rule, call.request, call.request.facts
        headers = list(request.headers)
        if rule.idempotency_header and effect.idempotency_key:
            name = rule.idempotency_header.lower()
            # Ours replaces any the client made up: an SDK mints a new one per retry.
            headers = [(n, v) for n, v in headers if n.lower() != name]
            headers.append((rule.idempotency_header, effect.idempotency_key))
        url = self._upstream.url(request.scheme, facts.host, facts.port, request.target)
        # Checked again right before sending, not only at admission: a sidecar frozen
        # since (a GC pause, a stopped VM) may have outlived its lease, and another node
        # may have taken the task over.  (A freeze between this check and the send is
        # the window left; an idempotency header closes it on the API's side.)
        failpoints.reach("effect.before_send", rule.name)
        try:
            time_left = await self._recorder.admit(call.binding, call.what, "proxy")
        except SidecarError as stopped:
            await self._best_effort(call, effect, EffectState.FAILED, f"not sent: {stopped.detail}")
            raise
        # The agent is answered by the rule's timeout, and never past the lease (after it,
        # another attempt may probe); the connection itself is kept settle_s longer.
        answer_within = max(0.001, min(rule.timeout_s, time_left.total_seconds()))
        # The one record of each forward (``sidecar matrix`` counts them): written before
        # the request leaves, so a sidecar killed right after it still shows it.
        log.info("effect forwarded", extra=call.fields)
        sending = asyncio.ensure_future(
            self._send(call, url, headers, timeout_s=rule.timeout_s + rule.settle_s)
        )
        slot = (call.binding.task, effect.key)
        try:
            reply = await asyncio.wait_for(asyncio.shield(sending), answer_within)
        except TimeoutError:
            await self._best_effort(
                call,
                effect,
                EffectState.UNKNOWN,
                f"no answer within {answer_within:g}s; the connection is kept up to "
                f"{rule.settle_s:g}s longer and its answer recorded",
            )
            self._linger(call, effect, sending)
            raise UpstreamFailed(
                f"task {call.binding.task}: {facts.method} {url}: no answer within "
                f"{answer_within:g}s; the outcome of {effect.key!r} is unknown - the answer "
                "is recorded if it still comes, and it is checked before it is sent again",
                timeout=True,
            ) from None
        except asyncio.CancelledError:
            # The agent's side went away (or the proxy is stopping): the request may be on
            # its way regardless, so its answer is still awaited and recorded.
            self._linger(call, effect, sending)
            raise
        except UpstreamError as error:
            self._first_try_ended(slot)
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
        self._first_try_ended(slot)
        failpoints.reach("effect.after_upstream", rule.name)
        return await self._record_reply(call, effect, reply, disposition)

    async def _send(
        self, call: Call, url: URL, headers: list[tuple[str, str]], timeout_s: float
    ) -> Reply:
        reply = await self._upstream.send(
            call.request.facts.method, url, headers, call.request.body or None, timeout_s=timeout_s
        )
        await failpoints.late("effect.upstream_answer", call.rule.name)  # a late answer
        return reply

    async def _record_reply(
        self, call: Call, effect: Effect, reply: Reply, disposition: str, *, late: bool = False
    ) -> Answer:
        """Record what the upstream answered (before anyone is answered with it)."""
        rule = call.rule
        if call.codec.already_exists(rule, reply):
            # The upstream says an earlier attempt already made it: fetch it, answer it.
            evidence = await self._probe(call, effect)
            if evidence is not None:
                return await self._complete_from_evidence(call, effect, evidence)
        state = call.codec.classify(rule, reply)
        # The agent gets the answer whole (_live_answer); the log keeps it redacted.
        recorded = call.kept(
            RecordedResponse(reply.status, recordable_response_headers(reply.headers), reply.body)
        )
        detail = f"upstream answered {reply.status}"
        if late:
            detail += " after the agent was told the request timed out"
        final = await self._transition(call, effect, state, detail, recorded)
        failpoints.reach("effect.after_record", rule.name)
        if state is EffectState.COMPLETED:
            self._remember(final)
            await self._checkpoint(call, recorded)
        log.info("effect %s: upstream %s", state.value, reply.status, extra=call.fields)
        return _live_answer(reply, disposition, state)

    def _linger(self, call: Call, effect: Effect, sending: asyncio.Future[Reply]) -> None:
        """Keep the first try's connection after the agent was answered, and record its
        answer when it comes (SPEC §3.8: an answer seen is an answer kept)."""
        slot = (call.binding.task, effect.key)

        async def record_when_answered() -> None:
            try:
                reply = await sending
            except UpstreamError as error:
                why = call.shown(str(error))
                log.info("the first try ended with no answer: %s", why, extra=call.fields)
                return
            except Exception:  # the connection's end is what matters; the error is logged
                log.exception("the first try failed", extra=call.fields)
                return
            finally:
                self._first_try_ended(slot)
            try:
                await self._record_reply(call, effect, reply, "recorded", late=True)
            except SidecarError as error:
                log.warning("a late answer was not recorded: %s", error.detail, extra=call.fields)

        lingering = spawn(record_when_answered(), name=f"linger:{slot[0]}:{slot[1]}")
        self._lingering[slot] = lingering
        # The attempt's release waits for it too (bounded), like any forward in flight.
        attempt = (call.binding.task, call.binding.attempt_id)
        self._forwarding.setdefault(attempt, set()).add(lingering)

        def forget(task: asyncio.Task[None]) -> None:
            if self._lingering.get(slot) is task:
                del self._lingering[slot]
            waiting = self._forwarding.get(attempt)
            if waiting is not None:
                waiting.discard(task)
                if not waiting:
                    del self._forwarding[attempt]

        lingering.add_done_callback(forget)

    def _first_try_ended(self, slot: tuple[str, str]) -> None:
        self._ended[slot] = self._clock.now()
        self._ended.move_to_end(slot)
        while len(self._ended) > ENDED_MAX:
            self._ended.popitem(last=False)

    async def _transition(
        self,
        call: Call,
        effect: Effect,
        to: EffectState,
        detail: str,
        response: RecordedResponse | None = None,
    ) -> Effect:
        binding = call.binding
        detail = call.shown(detail)  # an upstream error's text quotes the URL
        return await self._recorder.durably(
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
            await self._recorder.durably(
                lambda: self._store.append_checkpoint(
                    binding.task, binding.attempt_id, binding.generation, spec.stage, outputs
                )
            )
        except SidecarError as error:
            # The effect itself is recorded; the stage marker can be written again later.
            log.warning("checkpoint %s not written: %s", spec.stage, error.detail)

    def _note_later(self, binding: Binding, effect: Effect, event: str, detail: str | None) -> bool:
        """Write the audit line in the background; False if this attempt has one already."""
        # One audit line per attempt, effect and kind of event says who replayed what; an
        # agent retrying a call in a loop must not turn into a write per retry.
        seen = (binding.attempt_id, effect.task, effect.key, event, detail)
        if seen in self._noted:
            return False
        if len(self._noted) >= NOTED_MAX:
            self._noted.clear()
        self._noted.add(seen)

        async def write() -> None:
            try:
                await self._recorder.durably(
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
        return True


def fault(unexpected: BaseException, rule: Rule) -> SidecarFault:
    """The answer for an exception nobody meant to raise (its type and text, no trace)."""
    return SidecarFault(
        f"rule {rule.name}: {type(unexpected).__name__}: {unexpected}; nothing was forwarded "
        "that was not recorded first (an effect left pending is checked before it is sent again)"
    )


def _log_fault(match: RuleMatch, failed: SidecarFault, binding: Binding | None) -> None:
    """Log an unexpected failure; with its traceback unless the URL holds a secret, which
    the exception's own text might quote."""
    fields = _fields(binding, match.rule)
    if match.secrets:
        log.error("effect path failed: %s", failed.detail, extra=fields)
    else:
        log.exception("effect path failed", extra=fields)


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
