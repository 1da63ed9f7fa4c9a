"""One agent connection after start-up: relay, track, and hand guarded statements over.

Two sides share the connection, each handling what its socket delivers in the loop turn
that reads it (asyncio protocols, not tasks reading streams: a task would wake a turn
later, on every read).  The client side reads the agent's messages, keeps the
prepared-statement and portal maps (a statement prepared once and executed later still
maps to its SQL), and forwards everything no rule concerns as soon as it arrives.  When
a message would execute a statement a rule matches, the client side hands that request
to the :class:`~sidecar.pgwire.exactly_once.Statements` engine, in a task, which may
inject messages of its own; the agent is read no further until it is done.  The server
side attributes every server message to its request
(:class:`~sidecar.pgwire.tracker.Tracker`): the agent's answers are relayed, the
sidecar's own go to the engine.  While nothing of the sidecar's own is owed, the
server's bytes are relayed as read, with no message object made for them.  One guarded
statement has the agent say more while it runs: a ``COPY ... FROM STDIN``, whose rows the
client side streams to the server (or swallows, for a replay) as a :class:`CopyIn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.pgwire import messages
from sidecar.pgwire.codec import (
    BackendReader,
    FrontendReader,
    Message,
    ready_status,
    spans,
)
from sidecar.pgwire.tracker import Tracker
from sidecar.runtime.aio import spawn

log = logging.getLogger("sidecar.pgwire")

READ_SIZE = 1 << 16
#: Delivered to the engine when an error made the server skip its pending requests.
SKIPPED = b"!"


def _not_known() -> bool:
    return False


@dataclass(slots=True)
class Idleness:
    """Whether a connection can be closed without cutting anything the agent sent: no
    statement running or owed an answer, no transaction open.  Told by the session that
    frames the connection; one whose bytes are only copied is never known to be idle."""

    check: Callable[[], bool] = _not_known

    def __call__(self) -> bool:
        return self.check()


@dataclass(frozen=True, slots=True)
class Link:
    """An agent connection once start-up is done: both sides' streams, and the readers
    that framed them so far (bytes they hold back belong to the session)."""

    client_reader: asyncio.StreamReader
    client_writer: asyncio.StreamWriter
    server_reader: asyncio.StreamReader
    server_writer: asyncio.StreamWriter
    frontend: FrontendReader
    backend: BackendReader
    idle: Idleness = field(default_factory=Idleness)


@dataclass
class Prepared:
    sql: str
    guarded: bool


@dataclass
class Portal:
    statement: Prepared
    bind: messages.Bind | None


class CopyIn:
    """The agent's rows for a ``COPY ... FROM STDIN`` the engine runs: every CopyData up to
    the CopyDone or CopyFail that ends them, sent on to the server as they come
    (``forward``: the statement's first run) or swallowed (a replay, answered from the
    record).  ``ended`` is the message that ended them: the agent's CopyDone or CopyFail,
    or a CopyFail of the sidecar's own when the agent sent something a COPY does not
    take, or left (then, when forwarding, the server got that CopyFail too)."""

    __slots__ = ("ended", "forward")

    def __init__(self, *, forward: bool) -> None:
        self.forward = forward
        self.ended: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()


#: CopyData, and Flush and Sync, which the server ignores during a COPY FROM STDIN.
_COPY_GOES_ON = frozenset({b"d", b"H", b"S"})
_COPY_ENDS = frozenset({b"c", b"f"})  # CopyDone, CopyFail


class Engine(Protocol):
    """What the session asks of the exactly-once engine (None: no rules for SQL)."""

    def might_guard(self, sql: bytes) -> bool:
        """A first look at a query's bytes: False only if no statement of it can be one
        a rule records (then ``guards`` is not asked)."""
        ...

    def guards(self, sql: str) -> bool:
        """Whether any statement of ``sql`` is one a rule records."""
        ...

    async def simple(self, conversation: Conversation, sql: str, raw: bytes) -> None:
        """Run a simple Query holding a guarded statement; answer the agent."""
        ...

    async def execute(self, conversation: Conversation, portal: Portal, raw: bytes) -> None:
        """Run an Execute of a guarded statement (extended protocol); answer the agent."""
        ...

    def ready(self, status: str, committed: bool | None) -> None:
        """A ReadyForQuery went by: ``status``, and whether a transaction just committed
        (None: it was prepared for a two-phase commit, which COMMIT PREPARED or ROLLBACK
        PREPARED decides later, maybe on another connection)."""
        ...

    def closed(self) -> None:
        """The connection ended (the agent left, or was killed)."""
        ...


class _Answers:
    """Answers to the sidecar's own requests, handed over a batch at a time: a batch ends
    with the last answer owed (or with the server gone, or skipping them).

    One wake-up per batch: a queue of messages would wake the engine's task for each one
    (nine answers to a BEGIN and a record's insert)."""

    __slots__ = ("_batches", "_current", "_waiter")

    def __init__(self) -> None:
        self._current: list[Message] = []
        self._batches: deque[list[Message]] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def add(self, m: Message, last: bool) -> None:
        """One answer; ``last``: it was the last one owed."""
        self.extend([m], last)

    def extend(self, answers: list[Message], last: bool) -> None:
        """Answers, in the order they came; ``last``: the last of them was the last owed."""
        self._current += answers
        if last:
            self._batches.append(self._current)
            self._current = []
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(None)

    async def batch(self) -> list[Message]:
        """The oldest whole batch of answers, once it is in."""
        while not self._batches:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._batches.popleft()


@dataclass
class Conversation:
    """The two halves of one connection, as the engine sees them."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tracker: Tracker
    # Answers to the sidecar's own requests.
    ours: _Answers = field(default_factory=_Answers)
    became_idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Told at every ReadyForQuery: the status, and whether a transaction just committed
    # (None: prepared for a two-phase commit).
    on_ready: Callable[[str, bool | None], None] | None = None
    # A COPY FROM STDIN of the agent's that the engine sends: when the server answers it
    # with CopyInResponse, that goes to the agent and the agent's rows to the server.
    copy_in: CopyIn | None = None
    # How the client side is told to stream (or swallow) the agent's rows.
    take_rows: Callable[[CopyIn], None] | None = None

    def send_client(self, raw: bytes) -> None:
        self.client.write(raw)

    def rows_from_agent(self, copy: CopyIn) -> None:
        """Have the agent's COPY rows streamed (or swallowed) as ``copy`` says, now."""
        assert self.take_rows is not None, "no client side reads the agent"
        self.take_rows(copy)

    async def wait_idle(self) -> None:
        """Until every request sent so far is answered (the transaction status is known)."""
        while not self.tracker.idle:
            self.became_idle.clear()
            await self.became_idle.wait()

    async def ask(self, *parts: bytes) -> list[Message]:
        """Send requests of the sidecar's own; their answers (never relayed to the agent)."""
        return await self.answers(self.send(*parts))

    def send(self, *parts: bytes) -> bool:
        """Send requests of the sidecar's own without waiting: whether any will be
        answered (collect the answers with :meth:`answers` before anything else is sent,
        so that the caller can wait for something else meanwhile)."""
        answerable = self.tracker.sent_ours(parts)
        # One write, so one send: a request is several messages (Parse, Bind, Execute,
        # Close, Sync), and every send wakes the server.
        self.server.write(b"".join(parts))
        return answerable

    async def answers(self, answerable: bool) -> list[Message]:
        """The answers to what :meth:`send` sent."""
        await self.server.drain()
        if not answerable:
            return []
        answers = await self.ours.batch()
        if not answers[-1].kind:  # the server went away (it ends a batch)
            raise ConnectionError("the PostgreSQL server closed the connection")
        return answers


async def run_session(link: Link, engine: Engine | None) -> None:
    if engine is None:
        # No SQL rule: nothing to look for, so no message is framed at all.
        await _copy_both_ways(link)
        return
    conversation = Conversation(link.client_writer, link.server_writer, Tracker())
    conversation.on_ready = engine.ready
    server_side = await _ServerSide.attach(link, conversation)
    client_side: _ClientSide | None = None
    try:
        client_side = await _ClientSide.attach(link, conversation, engine)
        link.idle.check = client_side.idle
        # Either side's end is the session's: the agent leaving, the server going away.
        ends = {client_side.ended, server_side.ended}
        await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        if client_side.ended.done():
            client_side.ended.result()  # what broke the agent's side, if anything
    finally:
        engine.closed()
        if client_side is not None:
            client_side.stop()
        server_side.ended.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await server_side.ended
        with contextlib.suppress(Exception):
            link.server_writer.close()


async def _copy_both_ways(link: Link) -> None:
    async def copy(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pending: bytes
    ) -> None:
        if pending:
            writer.write(pending)
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()

    upward = asyncio.create_task(
        copy(link.client_reader, link.server_writer, link.frontend.leftover())
    )
    downward = asyncio.create_task(
        copy(link.server_reader, link.client_writer, link.backend.leftover())
    )
    try:
        await asyncio.wait({upward, downward}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (upward, downward):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await asyncio.gather(upward, downward)
        with contextlib.suppress(Exception):
            link.server_writer.close()


@dataclass(slots=True)
class _Since:
    """What the server said since its last ReadyForQuery: an error, a ROLLBACK, a
    PREPARE TRANSACTION."""

    errored: bool = False
    rolled_back: bool = False
    prepared: bool = False


# Past this much relayed to one side and not yet sent, the other is read no further
# until it is (asyncio's default high-water mark for a stream's writes).
CLIENT_BACKLOG = SERVER_BACKLOG = 64 * 1024


class _Side(asyncio.Protocol):
    """One side of a session's connection after start-up: what its socket delivers is
    handled in the loop turn that reads it.

    Read through a stream by a task, every read would wake that task one loop turn
    later: a turn (and a poll of the sockets) more per round trip, on every query relayed
    and three times per recorded statement.  So once start-up is done the connection's
    transport delivers to this protocol instead; the streams' own protocol keeps the
    writing side (``drain``) and hears that the connection was lost.  ``ended`` is the
    session's end as this side sees it: done when the peer closes the connection, failed
    with what broke it (a ProtocolError, a reset).  ``onward`` is where what this side
    reads is relayed to: while more than its backlog waits there unsent, this side is
    read no further.
    """

    name = "side"

    def __init__(
        self, transport: asyncio.Transport, onward: asyncio.StreamWriter, backlog: int
    ) -> None:
        self._transport = transport
        self._streams = transport.get_protocol()
        self._onward = onward
        self._backlog = backlog
        self._throttled = False
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def _take_over(self, reader: asyncio.StreamReader) -> None:
        """Take the connection over from its stream reader (what that reader holds and
        nobody read yet is handled first)."""
        transport = self._transport
        gone = reader.at_eof() or transport.is_closing()
        transport.set_protocol(self)
        reader.feed_eof()  # it is fed nothing more: at its end, it gives up what it holds
        self._first(await reader.read())
        if gone:
            _Side.connection_lost(self, None)  # gone before: never held back (see _ClientSide)
        elif not transport.is_reading() and self._may_read():
            transport.resume_reading()  # the reader had paused it, full

    def _first(self, held: bytes) -> None:
        """Handle what the stream reader held when this side took over."""
        if held:
            self.data_received(held)

    def _may_read(self) -> bool:
        return True

    def _relay(self, data: bytes) -> None:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        if self.ended.done():
            return
        try:
            self._relay(data)
        except Exception as error:  # a ProtocolError (or a bug): the session ends with it
            self._end(error)

    def eof_received(self) -> bool:
        self._end(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._streams.connection_lost(exc)  # wakes whoever waits in drain()
        self._end(exc)

    def pause_writing(self) -> None:
        self._streams.pause_writing()

    def resume_writing(self) -> None:
        self._streams.resume_writing()

    def _throttle_if_behind(self) -> None:
        """The other side reads slower than this one sends: stop reading this one until
        what waits for the other is sent."""
        if self._throttled or self._onward.transport.get_write_buffer_size() <= self._backlog:
            return
        self._throttled = True
        self._transport.pause_reading()
        spawn(self._resume_when_sent(), name=f"pg-{self.name}-throttle")

    async def _resume_when_sent(self) -> None:
        try:
            await self._onward.drain()
        except ConnectionError:
            return  # the other side is gone: it ends the session
        finally:
            self._throttled = False
        if self._may_read() and not self._transport.is_closing():
            self._transport.resume_reading()

    def _end(self, error: Exception | None) -> None:
        if self.ended.done():
            return
        if error is None:
            self.ended.set_result(None)
        else:
            self.ended.set_exception(error)


class _ServerSide(_Side):
    """The server's messages: the agent's answers relayed, the sidecar's own to the engine."""

    name = "server"

    def __init__(
        self, transport: asyncio.Transport, backend: BackendReader, conversation: Conversation
    ) -> None:
        super().__init__(transport, conversation.client, CLIENT_BACKLOG)
        self._backend = backend
        self._conversation = conversation
        self._since = _Since()

    @classmethod
    async def attach(cls, link: Link, conversation: Conversation) -> _ServerSide:
        transport = link.server_writer.transport
        assert isinstance(transport, asyncio.Transport)
        side = cls(transport, link.backend, conversation)
        await side._take_over(link.server_reader)
        return side

    def _relay(self, data: bytes) -> None:
        conversation = self._conversation
        tracker = conversation.tracker
        chunk, starts = self._backend.feed_chunk(data)
        if tracker.ours_owed:
            relay = _sort_out(chunk, starts, conversation, self._since)
        else:
            # Nothing of the sidecar's own is owed, so every message is the agent's: they
            # are followed (request queue, transaction status) and relayed as read.
            _follow(chunk, starts, conversation, self._since)
            relay = chunk
        if relay:
            conversation.client.write(relay)
            self._throttle_if_behind()
        if tracker.idle:
            conversation.became_idle.set()

    def _end(self, error: Exception | None) -> None:
        if not self.ended.done():
            self._conversation.ours.add(Message(b"", b"", b""), True)  # server gone
        super()._end(error)


def _follow(chunk: bytes, starts: list[int], conversation: Conversation, since: _Since) -> None:
    """Account for server messages that all answer the agent (no Message objects)."""
    tracker = conversation.tracker
    for at in starts:
        kind = chunk[at : at + 1]
        if kind == b"Z":
            tracker.answered(kind, ready_status(chunk, at) or "I")
            _ready(conversation, since)
            continue
        if kind == b"E":
            since.errored = True
        elif kind == b"C":
            tag = chunk[at + 5 : at + 25]
            since.rolled_back = tag.startswith(b"ROLLBACK\0")
            since.prepared = tag == b"PREPARE TRANSACTION\0"
        tracker.answered(kind)


def _sort_out(chunk: bytes, starts: list[int], conversation: Conversation, since: _Since) -> bytes:
    """Hand the answers to the sidecar's own requests to it; what is the agent's, to relay."""
    tracker = conversation.tracker
    ours = conversation.ours
    relay = bytearray()
    mine: list[Message] = []  # the sidecar's, handed over together (not one by one)
    for at, end in spans(chunk, starts):
        kind = chunk[at : at + 1]
        owed_before = tracker.ours_owed
        status = "I"
        if kind == b"E":
            since.errored = True
        elif kind == b"C":
            tag = chunk[at + 5 : at + 25]
            since.rolled_back = tag.startswith(b"ROLLBACK\0")
            since.prepared = tag == b"PREPARE TRANSACTION\0"
        elif kind == b"Z":
            status = ready_status(chunk, at) or "I"
        pending = tracker.answered(kind, status)
        # (A notification or a setting come while a request of the sidecar's own was out,
        # at its COMMIT say, is about the agent's session: the agent's, whenever it comes.)
        if pending is not None and pending.ours and kind not in _THE_AGENTS_ALWAYS:
            copy = conversation.copy_in
            if kind == b"G" and copy is not None and not copy.ended.done():
                # The agent's COPY FROM STDIN, run by the engine: the agent is asked for
                # its rows, and they go to the server from now on.
                relay += chunk[at:end]
                conversation.rows_from_agent(copy)
            elif kind in _COPY_IN:
                # The sidecar's own requests never stream rows: end the COPY at once,
                # failing its statement, rather than leave the server waiting for them.
                conversation.server.write(_COPY_FAIL)
            mine.append(Message(kind, None, chunk[at:end]))
            if not tracker.ours_owed:
                ours.extend(mine, True)
                mine = []
        else:
            relay += chunk[at:end]
            if owed_before and not tracker.ours_owed:
                # The agent's error made the server skip the sidecar's requests too.
                mine.append(Message(SKIPPED, b"", b""))
                ours.extend(mine, True)
                mine = []
        if kind == b"Z":
            _ready(conversation, since)
    if mine:
        ours.extend(mine, False)
    return bytes(relay)


# NotificationResponse (a NOTIFY for the agent's LISTEN) and ParameterStatus (a setting
# the agent's client keeps track of, e.g. one a rolled-back SET LOCAL changes back).
_THE_AGENTS_ALWAYS = (b"A", b"S")
# CopyInResponse and CopyBothResponse: the server waits for the client's rows.
_COPY_IN = (b"G", b"W")
_COPY_FAIL = messages.copy_fail(
    "effect-sidecar: a recorded statement cannot stream rows through the connection"
)


def _ready(conversation: Conversation, since: _Since) -> None:
    """A ReadyForQuery went by: tell the engine, start over for the next transaction."""
    if conversation.on_ready is not None:
        status = conversation.tracker.status
        ended = status == "I"
        committed: bool | None = ended and not since.errored and not since.rolled_back
        if committed and since.prepared:
            committed = None  # prepared for a two-phase commit: decided later, elsewhere
        conversation.on_ready(status, committed)
    since.errored = since.rolled_back = since.prepared = False


# The client messages the client loop decodes (the rest it relays by their type byte).
_LOOKED_AT = frozenset({b"P", b"B", b"C", b"X", b"Q", b"E"})


class _ClientSide(_Side):
    """The agent's messages: what no rule concerns is sent on as read; a message that runs
    a guarded statement is handed to the engine in a task (it waits for the store and
    the server), and the agent is read no further until the engine is done: what came
    with it, or comes meanwhile, is framed after - but for the rows of a COPY FROM STDIN
    the engine runs, which are streamed while it waits (:class:`CopyIn`).  ``ended``
    also fails with an error of the engine.
    """

    name = "client"

    def __init__(
        self,
        transport: asyncio.Transport,
        frontend: FrontendReader,
        conversation: Conversation,
        engine: Engine,
    ) -> None:
        super().__init__(transport, conversation.server, SERVER_BACKLOG)
        self._frontend = frontend
        self._conversation = conversation
        self._engine = engine
        self._statements: dict[str, Prepared] = {}
        self._portals: dict[str, Portal] = {}
        self._busy = False  # the engine runs a statement: the agent is not read
        self._running: asyncio.Task[None] | None = None  # that statement's task
        # The agent's end (EOF, or what broke the connection) come while the engine ran:
        # seen once it is done, as if the agent had not been read meanwhile.
        self._held_end: tuple[Exception | None] | None = None
        self._held_eof = False
        self._copy: CopyIn | None = None  # the agent's COPY rows being streamed

    def take_rows(self, copy: CopyIn) -> None:
        """Stream the agent's COPY rows as ``copy`` says, starting with any it sent
        already (the engine is running the COPY: the agent is read again meanwhile)."""
        self._copy = copy
        if self._held_end is not None or self._held_eof:  # it left before it was asked
            self._fail_copy("the agent's connection closed during COPY FROM STDIN")
            return
        self._stream_rows(b"")
        if self._copy is not None and not self._throttled and not self._transport.is_closing():
            self._transport.resume_reading()

    @classmethod
    async def attach(cls, link: Link, conversation: Conversation, engine: Engine) -> _ClientSide:
        transport = link.client_writer.transport
        assert isinstance(transport, asyncio.Transport)
        side = cls(transport, link.frontend, conversation, engine)
        conversation.take_rows = side.take_rows
        await side._take_over(link.client_reader)
        return side

    def _first(self, held: bytes) -> None:
        # Even with nothing held: the frontend framer may keep messages pipelined behind
        # the start-up ones.
        self.data_received(held)

    def _may_read(self) -> bool:
        return not self._busy or self._copy is not None

    def idle(self) -> bool:
        """No statement running (the engine's or one sent on) and no transaction open."""
        tracker = self._conversation.tracker
        return not self._busy and tracker.idle and tracker.status == "I"

    def data_received(self, data: bytes) -> None:
        if self._copy is not None and not self.ended.done():
            try:
                self._stream_rows(data)
            except Exception as error:  # a ProtocolError: the session ends with it
                self._fail_copy("the agent's COPY data could not be read")
                self._end(error)
            return
        if self._busy and not self.ended.done():
            self._frontend.hold(data)  # framed once the engine is done
            # Read no further until then.  Paused only now, not when the engine starts:
            # most agents wait for the answer, and a pause and a resume are two system
            # calls (epoll_ctl) per statement.
            self._transport.pause_reading()
            return
        super().data_received(data)

    def eof_received(self) -> bool:
        if self._busy and not self.ended.done():
            self._fail_copy("the agent's connection closed during COPY FROM STDIN")
            self._held_eof = True
            return True  # open (not read) until the engine is done: then closed
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._busy and not self.ended.done():
            self._fail_copy("the agent's connection closed during COPY FROM STDIN")
            self._streams.connection_lost(exc)  # a drain() fails now, as it would have
            self._held_end = (exc,)
            return
        super().connection_lost(exc)

    def stop(self) -> None:
        """The session is over: stop the engine's statement if one runs."""
        if self._running is not None:
            self._running.cancel()
        if self.ended.done() and not self.ended.cancelled():
            self.ended.exception()  # seen by run_session (or not worth reporting twice)
        self.ended.cancel()

    def _stream_rows(self, data: bytes) -> None:
        """The agent's COPY rows: sent on (or swallowed) up to the message that ends them;
        what follows that is held, as anything the agent says while the engine runs."""
        copy = self._copy
        assert copy is not None
        chunk, starts = self._frontend.feed_chunk(data)
        for at, end in spans(chunk, starts):
            kind = chunk[at : at + 1]
            if kind in _COPY_GOES_ON:
                continue
            if kind in _COPY_ENDS:
                last, rest = chunk[at:end], chunk[end:]
            else:  # what PostgreSQL, too, takes as the end of the rows, failing the COPY
                last = messages.copy_fail(f"unexpected message type 0x{kind[0]:02X} during COPY")
                rest = chunk[at:]
            if copy.forward:
                self._conversation.server.write(chunk[:at] + last)
            self._frontend.unread(rest)  # framed once the engine is done
            self._copy = None
            copy.ended.set_result(last)
            return
        if copy.forward and chunk:
            self._conversation.server.write(chunk)
            self._throttle_if_behind()

    def _fail_copy(self, reason: str) -> None:
        """End the agent's COPY rows with a CopyFail of the sidecar's own (the agent
        left, or sent what cannot be read): the server fails the statement."""
        copy, self._copy = self._copy, None
        if copy is None or copy.ended.done():
            return
        last = messages.copy_fail(reason)
        if copy.forward:
            self._conversation.server.write(last)
        copy.ended.set_result(last)

    def _relay(self, data: bytes) -> None:
        """Send on what no rule concerns; hand a guarded statement to the engine."""
        tracker = self._conversation.tracker
        server = self._conversation.server
        chunk, starts = self._frontend.feed_chunk(data)
        # Messages no rule concerns are sent on together: chunk[:at] when one stops them.
        for at, end in spans(chunk, starts):
            kind = chunk[at : at + 1]
            if kind not in _LOOKED_AT:
                tracker.sent(kind, ours=False)
                continue
            m = Message(kind, None, chunk[at:end])
            if kind == b"X":
                server.write(chunk[:end])
                self._end(None)
                return
            _keep_names(m, self._statements, self._portals, self._engine)
            handler = _handler(kind, m, self._portals, self._engine)
            if handler is None:
                tracker.sent(kind, ours=False)
                continue
            if at:
                server.write(chunk[:at])
            self._frontend.unread(chunk[end:])  # framed again once the engine is done
            self._busy = True  # (reading is paused only if the agent says more meanwhile)
            self._running = spawn(self._run(handler), name="pg-statement")
            return
        if chunk:
            # Most reads: one or more whole messages, none guarded - sent on as read.
            server.write(chunk)
        self._throttle_if_behind()

    async def _run(self, handler: Callable[[Conversation], Awaitable[None]]) -> None:
        """The engine's statement; then what the agent sent after it."""
        conversation = self._conversation
        try:
            await handler(conversation)
            await conversation.server.drain()
            await conversation.client.drain()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the engine's refusals are answers: this broke it
            self._end(error)
            return
        # Not called from here: a task may run to its end as soon as it is started (an
        # eager task, a refusal that awaits nothing), inside the _relay that started it.
        asyncio.get_running_loop().call_soon(self._go_on)

    def _go_on(self) -> None:
        """Read the agent again, starting with what came with the statement or since."""
        self._busy = False
        if self.ended.done():
            return
        if not self._throttled:
            self._transport.resume_reading()
        self.data_received(b"")
        if not self._busy:
            self._end_held()

    def _end_held(self) -> None:
        """The agent's end that came while the engine ran, now that it is done."""
        if self._held_end is not None:
            self._end(self._held_end[0])
        elif self._held_eof:
            self._end(None)
            self._transport.close()  # as the transport does after an EOF


def _keep_names(
    m: Message, statements: dict[str, Prepared], portals: dict[str, Portal], engine: Engine
) -> None:
    """Keep the prepared-statement and portal maps as Parse, Bind and Close change them."""
    kind = m.kind
    if kind == b"P":
        parse = messages.parse(m)
        statements[parse.name] = Prepared(parse.query, engine.guards(parse.query))
    elif kind == b"B":
        bind = messages.bind(m)
        # An unknown name is the server's to refuse ("prepared statement does not
        # exist"): relayed as not guarded.
        prepared = statements.get(bind.statement) or _UNKNOWN
        portals[bind.portal] = Portal(prepared, bind if prepared.guarded else None)
    elif kind == b"C":
        closed = messages.close(m)
        (statements if closed.target == "S" else portals).pop(closed.name, None)


def _handler(
    kind: bytes, m: Message, portals: dict[str, Portal], engine: Engine
) -> Callable[[Conversation], Awaitable[None]] | None:
    """The engine's handler for a message that runs a guarded statement, else None."""
    if kind == b"Q":
        if not engine.might_guard(m.raw[5:-1]):
            return None  # judged on the bytes: most queries are never decoded
        sql = messages.query_text(m)
        if engine.guards(sql):
            return lambda c: engine.simple(c, sql, m.raw)
    elif kind == b"E":
        portal = portals.get(messages.execute(m).portal)
        if portal is not None and portal.statement.guarded:
            return lambda c: engine.execute(c, portal, m.raw)
    return None


_UNKNOWN = Prepared("", guarded=False)
