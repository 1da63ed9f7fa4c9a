"""Every error effect-sidecar raises on purpose.

One root class; each subclass carries a stable ``code`` (the ``code`` member of the
control API's problem+json answers, the proxy's refusals, the CLI's messages) and
the HTTP ``status`` that code maps to: a class attribute, which an instance shadows only
where one code has two statuses (a schema violation is 422, unparsable input 400; an
upstream timeout is 504, another upstream failure 502).  Driver errors (sqlite3,
psycopg, OSError) are translated at the store boundary and nowhere else: into
:class:`StoreUnavailable`, or :class:`UnstorableValue` for a value the store cannot hold.

    SidecarError
    ├── ConfigError            bad flags, env, config or rule files (400)
    │   └── InvalidInjection   a pod's effect-sidecar.io/* annotation cannot be honoured
    ├── InvalidRequest         a body or parameter that does not validate (400; 422 for a
    │   │                      well-formed body that breaks its schema)
    │   ├── PayloadTooLarge    a matched effect's body over its rule's max_body_bytes (413)
    │   ├── UnstorableValue    a value the store cannot hold (a lone surrogate, an integer
    │   │                      beyond 64 bits, a NUL in PostgreSQL text): 422, alone
    │   └── PayloadMismatch    a replay whose payload differs, under on_divergence: reject (422)
    ├── NotFound               no such task / effect (404)
    ├── Unauthorized           missing or wrong control-API bearer token (401)
    ├── TaskUnbound            a matched effect with no task to record it under (428)
    ├── Conflict               (409)
    │   ├── LeaseHeld          another worker's lease on the task is live
    │   ├── TaskIsDone         the task was marked done: claims are refused until reopened
    │   ├── StaleGeneration    a write whose (attempt, generation) is not the task's current one
    │   ├── EffectExists       a second ``pending`` for a key the task already logged
    │   ├── EffectUnknown      an effect's outcome cannot be determined (needs a human)
    │   ├── EffectAbandoned    a human abandoned the effect: later attempts are refused
    │   ├── NotWaitingForAHuman  a resolution of an effect that is not (yet) a human's
    │   └── InvalidTransition  an effect state change the state machine forbids
    ├── Unavailable            try again later (503)
    │   ├── StoreUnavailable   the store cannot durably record right now (fail closed)
    │   │   └── SidecarUnreachable  no sidecar answers at a CLI's control address
    │   ├── NotReady           the sidecar is still starting (proxy, relay or lease not there yet)
    │   ├── LeaseExpiring      this sidecar's lease is about to expire un-renewed (self-fencing)
    │   ├── EffectSettling     an older attempt may still land the effect; wait before probing
    │   └── ProbeFailed        the evidence check could not be made
    ├── UpstreamFailed         the upstream answered 5xx or reset (502), or timed out (504):
    │                          outcome unknown
    └── SidecarFault           something unexpected inside the effect path (500): answered,
                               never forwarded un-recorded (SPEC §3.6)
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from sidecar.domain.model import Effect


class SidecarError(Exception):
    """effect-sidecar could not do what was asked."""

    code: ClassVar[str] = "internal"
    status: int = 500  # the class's; an instance shadows it only where noted
    title: ClassVar[str] = "Internal error"

    def __init_subclass__(
        cls, *, code: str | None = None, status: int | None = None, title: str | None = None
    ) -> None:
        """``class NotFound(SidecarError, code=..., status=..., title=...)``: what is not
        given is the parent's.  Every error class says its facts this way, on its class
        line, so the hierarchy reads as a table."""
        super().__init_subclass__()
        for name, given in (("code", code), ("status", status), ("title", title)):
            if given is not None:
                setattr(cls, name, given)

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or (self.__doc__ or self.title).strip()
        super().__init__(self.detail)

    def extensions(self) -> dict[str, Any]:
        """Extra machine-readable members for a problem+json body."""
        return {}


class ConfigError(SidecarError, code="invalid_config", status=400, title="Invalid configuration"):
    """The configuration is invalid."""


class InvalidInjection(ConfigError, code="invalid_injection", title="Invalid injection request"):
    """The pod cannot be injected as its annotations ask; nothing was changed."""

    def __init__(self, detail: str, *, annotation: str | None = None) -> None:
        self.annotation = annotation
        super().__init__(detail)

    def extensions(self) -> dict[str, Any]:
        return {"annotation": self.annotation} if self.annotation else {}


class InvalidRequest(SidecarError, code="invalid_request", status=400, title="Invalid request"):
    """The request is malformed or does not match its schema."""

    def __init__(
        self, detail: str | None = None, *, errors: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(detail)
        self.errors = errors or []
        if self.errors:
            # Schema violations (well-formed JSON, wrong content) are 422; unparsable input 400.
            self.status = 422

    def extensions(self) -> dict[str, Any]:
        return {"errors": self.errors} if self.errors else {}


class NotFound(SidecarError, code="not_found", status=404, title="Not found"):
    """No such resource."""


class Unauthorized(SidecarError, code="unauthorized", status=401, title="Unauthorized"):
    """A valid bearer token is required."""


class Conflict(SidecarError, code="conflict", status=409, title="Conflict"):
    """The request conflicts with the task's current state."""


class LeaseHeld(Conflict, code="lease_held", title="Lease held by another worker"):
    """Another worker holds a live lease on this task."""

    def __init__(self, task: str, holder: str, attempt_id: str, expires_at: datetime) -> None:
        self.task = task
        self.holder = holder
        self.attempt_id = attempt_id
        self.expires_at = expires_at
        super().__init__(
            f"task {task} is leased to worker {holder!r} (attempt {attempt_id}) "
            f"until {expires_at.isoformat()}"
        )

    def extensions(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "holder": self.holder,
            "holder_attempt_id": self.attempt_id,
            "lease_expires_at": self.expires_at.isoformat(),
        }


class TaskIsDone(Conflict, code="task_done", title="Task done"):
    """The task was marked done; it is not claimed again until it is reopened."""

    def __init__(self, task: str, done_at: datetime, by: str, note: str | None) -> None:
        self.task = task
        self.done_at = done_at
        self.by = by
        self.note = note
        why = f" ({note})" if note else ""
        super().__init__(
            f"task {task} was marked done by {by} at {done_at.isoformat()}{why}; "
            f"reopen it first (sidecar tasks reopen {task})"
        )

    def extensions(self) -> dict[str, Any]:
        return {"task": self.task, "done_at": self.done_at.isoformat(), "done_by": self.by,
                "note": self.note}  # fmt: skip


class StaleGeneration(Conflict, code="stale_generation", title="Stale generation"):
    """The write carries a generation that is not the task's current one; nothing was written."""

    def __init__(
        self,
        task: str,
        attempt_id: str,
        generation: int,
        current_generation: int,
        reason: str,
    ) -> None:
        self.task = task
        self.attempt_id = attempt_id
        self.generation = generation
        self.current_generation = current_generation
        self.reason = reason
        if generation == current_generation:
            # Its own generation, ended: say so, not "fenced (current generation N)".
            said = f"task {task}: attempt {attempt_id} (generation {generation}) may write "
            said += f"no more: {reason}"
        else:
            said = f"task {task}: attempt {attempt_id} generation {generation} is fenced "
            said += f"(current generation {current_generation}): {reason}"
        super().__init__(said)

    def extensions(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "attempt_id": self.attempt_id,
            "generation": self.generation,
            "current_generation": self.current_generation,
            "reason": self.reason,
        }


class EffectExists(Conflict, code="effect_exists", title="Effect already logged"):
    """The task's effect log already holds this effect key."""

    def __init__(self, existing: Effect) -> None:
        self.existing = existing
        super().__init__(
            f"task {existing.task}: effect {existing.key!r} is already {existing.state.value} "
            f"(attempt {existing.attempt_id}, generation {existing.generation})"
        )

    def extensions(self) -> dict[str, Any]:
        return {"effect_key": self.existing.key, "state": self.existing.state.value}


class InvalidTransition(Conflict, code="invalid_transition", title="Invalid effect transition"):
    """The effect state machine does not allow this change."""


class PayloadTooLarge(
    InvalidRequest, code="payload_too_large", status=413, title="Payload too large"
):
    """The request body is larger than its rule allows for a recorded effect."""


class UnstorableValue(
    InvalidRequest, code="unstorable_value", status=422, title="Value the store cannot hold"
):
    """The write carries a value the store cannot hold; nothing of it was written, and the
    other writes committed with it were (the group commit isolates it)."""


class PayloadMismatch(
    InvalidRequest,
    code="payload_mismatch",
    status=422,
    title="Payload differs from the recorded effect",
):
    """This effect was already performed with a different payload."""


class TaskUnbound(SidecarError, code="task_unbound", status=428, title="No task bound"):
    """No task is bound to this request, so its side effect cannot be recorded."""


class EffectUnknown(
    Conflict, code="effect_unknown", title="Effect outcome unknown (CANNOT DETERMINE)"
):
    """The effect's outcome is unknown and cannot be checked: a human must decide."""

    def __init__(self, task: str, key: str, detail: str) -> None:
        self.task = task
        self.key = key
        super().__init__(detail)

    def extensions(self) -> dict[str, Any]:
        return {"task": self.task, "effect_key": self.key}


class EffectAbandoned(Conflict, code="effect_abandoned", title="Effect abandoned by a human"):
    """A human abandoned this effect: it is not sent, now or by any later attempt."""

    def __init__(self, task: str, key: str, by: str, note: str) -> None:
        self.task = task
        self.key = key
        self.by = by
        self.note = note
        super().__init__(
            f"task {task}: effect {key!r} was abandoned by {by} ({note}); it is not sent "
            "again - change the agent, or start the task afresh"
        )

    def extensions(self) -> dict[str, Any]:
        return {"task": self.task, "effect_key": self.key, "abandoned_by": self.by,
                "note": self.note}  # fmt: skip


class NotWaitingForAHuman(
    Conflict, code="not_waiting_for_a_human", title="Effect not waiting for a human"
):
    """The effect is not waiting for a human: it is settled already, or an attempt could
    still land it (then ``retry_after_s`` says when to ask again, if it is known)."""

    def __init__(
        self, task: str, key: str, state: str, detail: str, *, retry_after_s: float | None = None
    ) -> None:
        self.task = task
        self.key = key
        self.state = state
        self.retry_after_s = retry_after_s
        super().__init__(detail)

    def extensions(self) -> dict[str, Any]:
        found: dict[str, Any] = {"task": self.task, "effect_key": self.key, "state": self.state}
        if self.retry_after_s is not None:
            found["retry_after_s"] = self.retry_after_s
        return found


class Unavailable(SidecarError, code="unavailable", status=503, title="Unavailable"):
    """Temporarily unavailable; retry later."""

    def __init__(self, detail: str | None = None, *, retry_after_s: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s

    def extensions(self) -> dict[str, Any]:
        return {} if self.retry_after_s is None else {"retry_after_s": self.retry_after_s}


class StoreUnavailable(Unavailable, code="store_unavailable", title="Store unavailable"):
    """The store cannot durably record right now; nothing was forwarded or acknowledged."""


class SidecarUnreachable(StoreUnavailable, code="sidecar_unreachable", title="No sidecar answers"):
    """No sidecar answers at the control address: nothing can be recorded through it (the
    CLI exits 5, as for a store that is unavailable)."""


class NotReady(Unavailable, code="not_ready", title="Not ready"):
    """Part of the sidecar is not in place yet (or was lost): agents must wait."""

    def __init__(self, pending: dict[str, str]) -> None:
        super().__init__(
            "waiting for " + "; ".join(f"{name}: {why}" for name, why in pending.items()),
            retry_after_s=1.0,
        )
        self.pending = pending

    def extensions(self) -> dict[str, Any]:
        return super().extensions() | {"pending": self.pending}


class LeaseExpiring(Unavailable, code="lease_expiring", title="Lease about to expire"):
    """This attempt's lease is about to expire and was not renewed: writes are held back."""


class EffectSettling(Unavailable, code="effect_settling", title="Effect settling"):
    """An earlier attempt could still land this effect; it is checked once that is over."""


class ProbeFailed(Unavailable, code="probe_failed", title="Probe failed"):
    """The evidence check for an effect of unknown outcome could not be made."""


class UpstreamFailed(SidecarError, code="upstream_failed", status=502, title="Upstream failed"):
    """The upstream did not answer definitively; the effect's outcome is unknown."""

    def __init__(self, detail: str, *, timeout: bool = False) -> None:
        super().__init__(detail)
        self.timeout = timeout
        if timeout:
            self.status = 504


class SidecarFault(SidecarError, code="sidecar_error", status=500, title="Sidecar error"):
    """Something unexpected went wrong inside the effect path (a bug, a value a client
    library refused).  The request is answered by the sidecar with this, never handed to
    the proxy engine to forward on its own; whatever was recorded first stays pending,
    which a later attempt treats as unknown (SPEC §3.6)."""
