"""One agent connection after start-up: relay, track, and hand guarded statements over.

Two loops share the connection.  The client loop reads the agent's messages, keeps the
prepared-statement and portal maps (a statement prepared once and executed later still
maps to its SQL), and forwards everything no rule concerns as soon as it arrives.  When
a message would execute a statement a rule matches, the client loop hands that request
to the :class:`~sidecar.pgwire.exactly_once.Statements` engine, which may inject
messages of its own.  The server loop attributes every server message to its request
(:class:`~sidecar.pgwire.tracker.Tracker`): the agent's answers are relayed, the
sidecar's own go to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.pgwire import messages
from sidecar.pgwire.codec import BackendReader, FrontendReader, Message
from sidecar.pgwire.tracker import Tracker

log = logging.getLogger("sidecar.pgwire")

READ_SIZE = 1 << 16
#: Delivered to the engine when an error made the server skip its pending requests.
SKIPPED = b"!"


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


@dataclass
class Prepared:
    sql: str
    guarded: bool


@dataclass
class Portal:
    statement: Prepared
    bind: messages.Bind | None


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

    def ready(self, status: str, committed: bool) -> None:
        """A ReadyForQuery went by: ``status``, and whether a transaction just committed."""
        ...

    def closed(self) -> None:
        """The connection ended (the agent left, or was killed)."""
        ...


@dataclass
class Conversation:
    """The two halves of one connection, as the engine sees them."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tracker: Tracker
    # Answers to the sidecar's own requests, each with "was that the last one owed".
    ours: asyncio.Queue[tuple[Message, bool]] = field(default_factory=asyncio.Queue)
    became_idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Told at every ReadyForQuery: the status, and whether a transaction just committed.
    on_ready: Callable[[str, bool], None] | None = None

    def send_client(self, raw: bytes) -> None:
        self.client.write(raw)

    async def wait_idle(self) -> None:
        """Until every request sent so far is answered (the transaction status is known)."""
        while not self.tracker.idle:
            self.became_idle.clear()
            await self.became_idle.wait()

    async def ask(self, *parts: bytes) -> list[Message]:
        """Send requests of the sidecar's own; their answers (never relayed to the agent)."""
        answerable = False
        for raw in parts:
            self.tracker.sent(raw[:1], ours=True)
            answerable = answerable or raw[:1] != b"H"
        # One write, so one send: a request is several messages (Parse, Bind, Execute,
        # Close, Sync), and every send wakes the server.
        self.server.write(b"".join(parts))
        await self.server.drain()
        answers: list[Message] = []
        while answerable:
            m, last = await self.ours.get()
            if not m.kind:
                raise ConnectionError("the PostgreSQL server closed the connection")
            answers.append(m)
            answerable = not last
        return answers


async def run_session(link: Link, engine: Engine | None) -> None:
    if engine is None:
        # No SQL rule: nothing to look for, so no message is framed at all.
        await _copy_both_ways(link)
        return
    conversation = Conversation(link.client_writer, link.server_writer, Tracker())
    conversation.on_ready = engine.ready
    server_task = asyncio.create_task(_server_loop(link.server_reader, link.backend, conversation))
    client_task = asyncio.create_task(
        _client_loop(link.client_reader, link.frontend, conversation, engine)
    )
    # When the server goes away, the client loop (waiting on the agent) ends too.
    server_task.add_done_callback(lambda _: client_task.cancel())
    try:
        await client_task
    except asyncio.CancelledError:
        if not server_task.done():
            raise  # this session itself is being cancelled
    finally:
        engine.closed()
        client_task.cancel()
        server_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await server_task
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


async def _server_loop(
    reader: asyncio.StreamReader, backend: BackendReader, conversation: Conversation
) -> None:
    tracker = conversation.tracker
    on_ready = conversation.on_ready
    errored, rolled_back = False, False
    while data := await reader.read(READ_SIZE):
        relay = bytearray()
        for m in backend.feed(data):
            kind = m.kind
            owed_before = tracker.ours_owed
            if kind == b"E":
                errored = True
            elif kind == b"C":
                rolled_back = m.raw[5:14] == b"ROLLBACK\0"
            pending = tracker.received(m)
            if pending is not None and pending.ours:
                conversation.ours.put_nowait((m, tracker.ours_owed == 0))
            else:
                relay += m.raw
                if owed_before and not tracker.ours_owed:
                    # The agent's error made the server skip the sidecar's requests too.
                    conversation.ours.put_nowait((Message(SKIPPED, b"", b""), True))
            if kind == b"Z":
                if on_ready is not None:
                    ended = tracker.status == "I"
                    on_ready(tracker.status, ended and not errored and not rolled_back)
                errored, rolled_back = False, False
        if relay:
            conversation.client.write(bytes(relay))
            await conversation.client.drain()
        if tracker.idle:
            conversation.became_idle.set()
    conversation.ours.put_nowait((Message(b"", b"", b""), True))  # the server went away


async def _client_loop(
    reader: asyncio.StreamReader,
    frontend: FrontendReader,
    conversation: Conversation,
    engine: Engine,
) -> None:
    statements: dict[str, Prepared] = {}
    portals: dict[str, Portal] = {}
    guarded = engine.guards
    tracker = conversation.tracker
    pending = frontend.leftover()
    while data := pending or await reader.read(READ_SIZE):
        pending = b""
        out = bytearray()
        for m in frontend.feed(data):
            kind = m.kind
            if kind == b"P":
                parse = messages.parse(m)
                statements[parse.name] = Prepared(parse.query, guarded(parse.query))
            elif kind == b"B":
                bind = messages.bind(m)
                # An unknown name is the server's to refuse ("prepared statement does
                # not exist"): relayed as not guarded.
                prepared = statements.get(bind.statement) or _UNKNOWN
                portals[bind.portal] = Portal(prepared, bind if prepared.guarded else None)
            elif kind == b"C":
                closed = messages.close(m)
                (statements if closed.target == "S" else portals).pop(closed.name, None)
            elif kind == b"X":
                conversation.server.write(bytes(out) + m.raw)
                return
            handler = _handler(kind, m, portals, engine)
            if handler is None:
                tracker.sent(kind, ours=False)
                out += m.raw
                continue
            if out:
                conversation.server.write(bytes(out))
                out.clear()
            await handler(conversation)
        if out:
            conversation.server.write(bytes(out))
        await conversation.server.drain()
        await conversation.client.drain()


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
