"""The n-th run of the same statement inside one attempt is an effect of its own.

A statement's effect key comes from its text and parameters, but running the same text
twice in one attempt is often meant: a migration that drops and re-creates a view,
alembic's upgrade / downgrade / upgrade, a second ``pgbench -i``.  Keyed by text alone,
the second run would be answered from the first one's record and silently not run.  So
each key gets the ordinal of its run within the attempt (SPEC §3.9): the first keeps the
plain key, the n-th is ``KEY #n``.  A new attempt that repeats the work from the top
counts from 1 again, meets the same keys, and is answered from the records.

An ordinal is taken before the statement runs (its record needs the key) and given back
when its record does not commit (the statement failed, its transaction rolled back, the
sidecar refused it): the retry of a failed transaction takes the same ordinal again,
exactly as the resumed attempt will.  Connections of one attempt share the count.  A
statement that names its effect (``/* sidecar:key=NAME */``) gets no ordinal: the name
says it runs once per task.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

#: Attempts whose counts are kept (the oldest are forgotten first; an attempt's count is
#: needed only while it runs).
ATTEMPTS_KEPT = 1024


class _Attempt:
    __slots__ = ("bases", "counts")

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.bases: dict[str, str] = {}  # key taken -> its base, until it commits or not


class Ordinals:
    def __init__(self) -> None:
        self._attempts: OrderedDict[tuple[str, str], _Attempt] = OrderedDict()

    def take(self, task: str, attempt_id: str, base: str) -> str:
        """The key of the next run of ``base`` in this attempt."""
        attempt = self._attempt(task, attempt_id)
        attempt.counts[base] += 1
        key = _key(base, attempt.counts[base])
        attempt.bases[key] = base
        return key

    def kept(self, task: str, attempt_id: str, key: str) -> None:
        """``key``'s record committed (or was found): its ordinal stays taken."""
        attempt = self._attempts.get((task, attempt_id))
        if attempt is not None:
            attempt.bases.pop(key, None)

    def give_back(self, task: str, attempt_id: str, key: str) -> None:
        """``key``'s run left no record: the next run of its statement takes its ordinal.
        (Only the newest ordinal can be given back; an older one leaves a gap.)"""
        attempt = self._attempts.get((task, attempt_id))
        if attempt is None or (base := attempt.bases.pop(key, None)) is None:
            return
        if key == _key(base, attempt.counts[base]):
            attempt.counts[base] -= 1

    def _attempt(self, task: str, attempt_id: str) -> _Attempt:
        slot = (task, attempt_id)
        attempt = self._attempts.get(slot)
        if attempt is None:
            attempt = self._attempts[slot] = _Attempt()
            while len(self._attempts) > ATTEMPTS_KEPT:
                self._attempts.popitem(last=False)
        else:
            self._attempts.move_to_end(slot)
        return attempt


def _key(base: str, ordinal: int) -> str:
    return base if ordinal == 1 else f"{base} #{ordinal}"
