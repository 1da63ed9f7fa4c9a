"""The eight steps of the seed's RESUME CHECKLIST, performed now against a store.

1. the lease is free or expired (who held it, until when); 2. the store takes a durable
write (its own test write + delete, as ``/readyz`` does); 3. the last checkpoint and its
outputs; 4. every pending/unknown effect probed now (:mod:`.probing`); 5. what the next
attempt will replay, send, or leave to a human; 6. fencing (the current generation, the
next claim's, the stale writes refused so far); 7. where the next attempt resumes; 8. the
verdict.  :func:`run_checklist` is the one implementation: the CLI calls it on a store it
opens (``--data-dir``/``--store``), the control route inside a running sidecar.

**Resume writes nothing** (beyond step 2's test row, which the store deletes in the same
transaction).  It does not claim the task - it is the check an operator runs *before*
restarting the agent, and a claim would mint a generation, fence the very worker the
operator is about to start, and hold a lease nobody heartbeats.  Nor does it record what
a probe finds: every effect write is fenced by ``(attempt_id, generation)`` against a
live lease (:func:`sidecar.domain.leases.fence`), which resume does not hold, and
recording a probe's evidence under an operator's name would turn a machine's finding
into a human resolution (``sidecar effects resolve`` is that path, and it is refused
while a first try could still land).  It is not needed either: the next attempt's guard
runs the same probe (with the agent's own credentials) and records the evidence under
its own fenced lease, answering ``X-Sidecar-Effect: probed``.  So a found effect is
reported, with the probe's evidence, as "will be replayed"; if the world changes before
the next attempt runs, the guard sees the change, not a stale note from resume.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime

from sidecar.domain.model import Effect, EffectState, TaskView
from sidecar.errors import NotFound, SidecarError
from sidecar.resume import judge
from sidecar.resume.model import EffectCheck, Found, Next, Probed, Report, Status, Step, Verdict
from sidecar.resume.probing import Prober
from sidecar.rules import RuleSet
from sidecar.runtime.clock import Clock
from sidecar.store import Store, StoreInfo

OUTPUTS_SHOWN = 600  # characters of a checkpoint's outputs in the evidence


type WriteCheck = Callable[[], Awaitable[StoreInfo]]


async def run_checklist(
    store: Store,
    task: str,
    *,
    rules: RuleSet,
    prober: Prober | None,
    clock: Clock,
    write_check: WriteCheck | None = None,
) -> Report:
    """Run the checklist for ``task``; NotFound if it was never claimed.  A store that
    cannot be *read* raises StoreUnavailable (the caller's exit 5); one that cannot be
    *written* is step 2's finding, in the report.  ``write_check`` proves a durable write
    and describes the store (default: ``store``'s own test write + delete)."""
    view = await store.task_view(task)
    if view is None:
        raise NotFound(f"task {task} has never been claimed: nothing to resume")
    now = clock.now()
    state = view.state
    done, held = state.done is not None, judge.lease_is_live(state, now)
    lease = _lease_step(view, now)
    writable = await _store_step(write_check or (lambda: _test_write(store)))
    checkpoint = _checkpoint_step(view)
    effects = await store.effects(task)
    skip = _why_not_probe(done=done, held=held, writable=writable.status is Status.OK)
    checks = await _check_effects(store, view, effects, rules, prober, now, skip)
    refusals = await store.refusals(task)
    found, code = judge.verdict(
        done=done, held=held, writable=writable.status is Status.OK, effects=checks
    )
    steps = [
        lease,
        writable,
        checkpoint,
        _probed_step(checks, skip),
        _next_step(checks),
        _fencing_step(view, len(refusals), refusals[-1].reason if refusals else None),
        _resume_point_step(view, found),
    ]
    summary = _summary(task, found, checks, view)
    steps.append(_step(8, "verdict", "verdict", _verdict_status(found), [summary]))
    return Report(
        task=task,
        checked_at=now,
        generation=state.generation,
        steps=steps,
        effects=checks,
        verdict=found,
        exit_code=code,
        summary=summary,
    )


def _step(number: int, name: str, title: str, status: Status, evidence: list[str]) -> Step:
    return Step(number=number, name=name, title=title, status=status, evidence=evidence)


def _when(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def _lease_step(view: TaskView, now: datetime) -> Step:
    state, lease = view.state, view.state.lease
    title = "lease free or expired"
    if state.done is not None:
        done = state.done
        why = f"task is marked done by {done.by} at {_when(done.at)}"
        return _step(
            1, "lease", title, Status.FAILED, [f"{why}: claims are refused until it is reopened"]
        )
    if lease is None:
        return _step(1, "lease", title, Status.OK, ["free: no lease was ever held"])
    holder = f"attempt {lease.attempt_id} of worker {lease.worker}, generation {lease.generation}"
    if lease.released_at is not None:
        line = f"free: released at {_when(lease.released_at)} by {holder}"
    elif lease.is_live(now):
        left = (lease.expires_at - now).total_seconds()
        line = (
            f"HELD by {holder} until {_when(lease.expires_at)} ({left:.0f}s left, renewed by "
            "its heartbeats): a live worker has the task"
        )
        return _step(1, "lease", title, Status.FAILED, [line])
    else:
        line = f"expired at {_when(lease.expires_at)}: held by {holder}"
    return _step(1, "lease", title, Status.OK, [line])


async def _test_write(store: Store) -> StoreInfo:
    await store.check_writable()
    return await store.info()


async def _store_step(check: WriteCheck) -> Step:
    title = "store writable (test write + delete)"
    try:
        info = await check()
    except SidecarError as error:
        return _step(2, "store_writable", title, Status.FAILED, [f"not writable: {error.detail}"])
    durable = "durable" if info.durable else "NOT durable"
    line = (
        f"a test write and its delete committed ({info.backend}, schema "
        f"{info.schema_version}, {durable})"
    )
    return _step(2, "store_writable", title, Status.OK, [line])


def _checkpoint_step(view: TaskView) -> Step:
    title = "last checkpoint and its outputs"
    last = view.last_checkpoint
    if last is None:
        return _step(3, "last_checkpoint", title, Status.OK, ["none: no stage was recorded yet"])
    outputs = json.dumps(last.outputs, sort_keys=True)
    if len(outputs) > OUTPUTS_SHOWN:
        outputs = outputs[:OUTPUTS_SHOWN] + "..."
    line = (
        f"#{last.seq} {last.stage} by attempt {last.attempt_id} (generation "
        f"{last.generation}) at {_when(last.created_at)}; outputs {outputs}"
    )
    return _step(3, "last_checkpoint", title, Status.OK, [line])


def _why_not_probe(*, done: bool, held: bool, writable: bool) -> str | None:
    """Probing is for a task about to be resumed; when it cannot be, say why not."""
    if done:
        return "not probed: the task is done"
    if held:
        return "not probed: a live worker holds the task and may be sending them now"
    if not writable:
        return "not probed: the store cannot be written, so no attempt could record anything"
    return None


async def _check_effects(
    store: Store,
    view: TaskView,
    effects: list[Effect],
    rules: RuleSet,
    prober: Prober | None,
    now: datetime,
    skip: str | None,
) -> list[EffectCheck]:
    checks = []
    for effect in effects:
        rule = rules.get(effect.rule)
        probed: Probed | None = None
        if judge.wants_probe(effect, rule):
            if skip is not None:
                probed = Probed(found=Found.CANNOT_PROBE, evidence=skip)
            elif prober is None:
                probed = Probed(
                    found=Found.CANNOT_PROBE, evidence="no upstream client to probe with"
                )
            else:
                probed = await prober.probe(effect)
        lease_until = await _lease_until(store, view, effect)
        checks.append(judge.judge(effect, rule, probed, now=now, lease_until=lease_until))
    return checks


async def _lease_until(store: Store, view: TaskView, effect: Effect) -> datetime | None:
    """Until when the attempt that last drove ``effect`` could send it: its ended lease,
    or the task's lease if it is still that attempt's (expired, not yet taken over)."""
    if effect.state not in (EffectState.PENDING, EffectState.UNKNOWN):
        return None
    lease = view.state.lease
    if lease is not None and lease.attempt_id == effect.attempt_id:
        return lease.released_at or lease.expires_at
    attempt = await store.attempt(effect.attempt_id)
    return None if attempt is None else attempt.lease_until


def _probed_step(checks: list[EffectCheck], skip: str | None) -> Step:
    title = "every pending/unknown effect probed now"
    open_ = [c for c in checks if c.state in ("pending", "unknown")]
    if not open_:
        return _step(4, "effects_probed", title, Status.OK, ["none pending or unknown"])
    lines = [
        f"{c.key} (rule {c.rule}, {c.state}): {c.found.value.replace('_', ' ').upper()}: "
        f"{c.evidence}"
        for c in open_
    ]
    if skip is not None:
        return _step(4, "effects_probed", title, Status.SKIPPED, lines)
    stuck = any(c.next in (Next.HUMAN, Next.WAIT) for c in open_)
    return _step(4, "effects_probed", title, Status.CANNOT_DETERMINE if stuck else Status.OK, lines)


def _next_step(checks: list[EffectCheck]) -> Step:
    title = "what the next attempt will do"
    if not checks:
        return _step(5, "next_attempt", title, Status.OK, ["no effects logged: it starts fresh"])
    lines = [f"{c.next.value.upper()} {c.key}: {c.why}" for c in checks]
    stuck = any(c.next in (Next.HUMAN, Next.WAIT) for c in checks)
    return _step(5, "next_attempt", title, Status.CANNOT_DETERMINE if stuck else Status.OK, lines)


def _fencing_step(view: TaskView, refused: int, last_reason: str | None) -> Step:
    generation = view.state.generation
    lines = [
        f"current generation {generation}; the next claim gets generation {generation + 1}, "
        f"and every write of generation {generation} or older is refused (409 stale_generation)",
        f"stale writes refused for this task so far: {refused}"
        + (f" (last: {last_reason})" if last_reason else ""),
    ]
    return _step(6, "fencing", "fencing active", Status.OK, lines)


def _resume_point_step(view: TaskView, found: Verdict) -> Step:
    last = view.last_checkpoint
    where = f"after {last.stage} (checkpoint #{last.seq})" if last else "from the top"
    line = (
        f"the next attempt's claim is told its last checkpoint and resumes {where}; what "
        "its agent repeats is answered from the log as listed in step 5"
    )
    status = Status.OK if found is Verdict.SAFE else Status.SKIPPED
    return _step(7, "resume_point", "resume from the next incomplete stage", status, [line])


def _verdict_status(found: Verdict) -> Status:
    if found is Verdict.SAFE:
        return Status.OK
    if found is Verdict.CANNOT_DETERMINE:
        return Status.CANNOT_DETERMINE
    return Status.FAILED


def _summary(task: str, found: Verdict, checks: list[EffectCheck], view: TaskView) -> str:
    counts = {n: sum(1 for c in checks if c.next is n) for n in Next}
    plan = ", ".join(f"{counts[n]} to {n.value}" for n in Next if counts[n])
    match found:
        case Verdict.SAFE:
            return f"SAFE TO RESUME task {task}: {plan or 'no effects logged'}"
        case Verdict.CANNOT_DETERMINE:
            keys = ", ".join(repr(c.key) for c in checks if c.next in (Next.HUMAN, Next.WAIT))
            return (
                f"CANNOT DETERMINE: {keys} of task {task} {'waits' if ',' not in keys else 'wait'}"
                f" (for a human: `sidecar effects resolve {task} KEY --as "
                "completed|failed|abandoned`, or until the time shown); the task stays blocked"
            )
        case Verdict.LEASE_HELD:
            lease = view.state.lease
            who = f"worker {lease.worker} (attempt {lease.attempt_id})" if lease else "a worker"
            return f"LEASE HELD: {who} holds task {task}; do not start another attempt"
        case Verdict.STORE_UNAVAILABLE:
            return "STORE UNAVAILABLE: no attempt could record its effects; fix the store first"
        case Verdict.NOT_RESUMABLE:
            return f"NOT RESUMABLE: task {task} is done (`sidecar tasks reopen {task}` first)"
