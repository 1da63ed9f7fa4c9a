"""Which server message answers which client message: the outstanding-request queue.

Counting ReadyForQuery messages is not enough once the sidecar adds messages of its own
to a connection: it must know which answers are its own (and swallow them) and which
are the client's (and relay them).  As pgbouncer does, every request that will be
answered is queued when it is sent, and server messages are attributed to the oldest
one until its terminal message arrives:

    Query         everything up to and including ReadyForQuery
    Parse         ParseComplete            Bind      BindComplete
    Describe      (ParameterDescription) RowDescription | NoData
    Execute       rows, then CommandComplete | EmptyQueryResponse | PortalSuspended
    Close         CloseComplete            Sync      ReadyForQuery
    FunctionCall  FunctionCallResponse, then ReadyForQuery

An ErrorResponse ends the current request; in the extended protocol the server then
skips every message up to the next Sync, so those requests are dropped from the queue
unanswered.  Notices, notifications and parameter changes can come at any time and are
attributed to whatever is current (or relayed if nothing is).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sidecar.pgwire.codec import Message

_TERMINAL = {
    b"P": {b"1"},
    b"B": {b"2"},
    b"D": {b"T", b"n"},
    b"E": {b"C", b"I", b"s"},
    b"C": {b"3"},
    b"S": {b"Z"},
    b"Q": {b"Z"},
    b"F": {b"Z"},
}
ASYNC = frozenset({b"N", b"A", b"S"})  # notice, notification, parameter status


@dataclass(frozen=True, slots=True)
class Pending:
    kind: bytes  # the client message type this answers
    ours: bool  # injected by the sidecar: its answers are not relayed
    extended: bool  # part of an extended-protocol run (skipped after an error)


#: One Pending per request type and side, shared by every queue: a request is queued for
#: each message a relay that frames sends on, and a new object each time showed up in
#: its CPU per statement.
_PENDING = {
    (kind, ours): Pending(kind, ours, kind in b"PBDECS")
    for kind in _TERMINAL
    for ours in (False, True)
}


class Tracker:
    def __init__(self) -> None:
        self.queue: deque[Pending] = deque()
        self.status = "I"  # from the last ReadyForQuery
        self.ours_owed = 0  # queued requests of the sidecar's own (kept, not counted)

    def sent(self, kind: bytes, *, ours: bool) -> None:
        if (pending := _PENDING.get((kind, ours))) is not None:
            self.queue.append(pending)
            self.ours_owed += ours

    def sent_ours(self, parts: tuple[bytes, ...]) -> bool:
        """:meth:`sent` for requests of the sidecar's own (whole messages, in the order
        sent): whether any of them will be answered (all but a Flush are)."""
        answerable = False
        for raw in parts:
            kind = raw[:1]
            self.sent(kind, ours=True)
            answerable = answerable or kind != b"H"
        return answerable

    def _pop(self) -> Pending:
        done = self.queue.popleft()
        self.ours_owed -= done.ours
        return done

    @property
    def idle(self) -> bool:
        return not self.queue

    def received(self, m: Message) -> Pending | None:
        """Attribute a server message; returns the request it answers (None: unsolicited)."""
        ready = m.kind == b"Z" and len(m.raw) > 5
        return self.answered(m.kind, chr(m.raw[5]) if ready else "I")

    def answered(self, kind: bytes, status: str = "I") -> Pending | None:
        """:meth:`received` for a message known by its type byte alone (and, for a
        ReadyForQuery, its status): the relay's fast path frames no Message objects."""
        if not self.queue:
            return None
        head = self.queue[0]
        if kind in ASYNC and head.kind not in (b"Q", b"F"):
            return head
        # An error answering Sync (a COMMIT of the implicit transaction failing, e.g. on a
        # deferred constraint) is followed by that Sync's own ReadyForQuery.
        if kind == b"E" and head.kind not in (b"Q", b"F", b"S"):
            self._pop()
            # The server now ignores everything until Sync: those requests get no answer.
            while self.queue and self.queue[0].kind != b"S":
                self._pop()
            return head
        if kind == b"Z":
            self.status = status
        if kind in _TERMINAL[head.kind]:
            self._pop()
        return head
