"""Exactly-once SQL statements: the record lives in the target database, in the same
transaction as the statement it records.

For a statement a rule matches (in the scope of the connection's task), the sidecar
inserts ``(task, key)`` into ``effect_sidecar.effects`` *in the agent's database*
(:mod:`.records`), with ``ON CONFLICT DO NOTHING RETURNING``, in the same transaction as
the statement:

* a row comes back - the effect is new: the statement runs, its command tag (and any
  rows it returned) is stored in that row, and statement and record commit - or roll
  back - together.  No window remains between "done" and "recorded";
* no row - a committed record exists: the statement is not sent, the agent gets the
  recorded command tag (and rows) as if it had run.  (A record still being written by
  another connection makes the insert wait for that transaction, so two agents cannot
  both run it.)

A statement outside a transaction is wrapped in one the sidecar opens and commits; one
inside the agent's transaction is recorded in it, and counts only if the agent commits.
The n-th run of the same statement in one attempt has a key of its own (:mod:`.ordinals`).
The outcome is mirrored into the sidecar's own effect log (:mod:`.mirror`): a stale
attempt's statement is refused there first (``ES409``) and never runs.

Round trips are what a recorded statement costs, so the sidecar's own requests ride
together where they can: its BEGIN goes with the first request of the transaction, the
completion of a record with the COMMIT, and logging the effect pending overlaps with
both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sidecar.domain.model import EffectState
from sidecar.errors import SidecarError, StaleGeneration
from sidecar.pgwire import messages, records, redaction
from sidecar.pgwire.codec import Message
from sidecar.pgwire.mirror import Done, LogMirror, Mirrors
from sidecar.pgwire.ordinals import Ordinals
from sidecar.pgwire.records import Refused, Skipped
from sidecar.pgwire.session import SKIPPED, Conversation, CopyIn, Portal
from sidecar.recording.bindings import Binding, Bindings, BindRequest
from sidecar.recording.recorder import Recorder
from sidecar.rules import EffectKind, RuleSet
from sidecar.rules.matcher import SqlRuleMatch
from sidecar.rules.sql import NO_TRANSACTION, Statement, split
from sidecar.runtime import failpoints
from sidecar.runtime.kept import keep
from sidecar.runtime.metrics import Metrics
from sidecar.store import Store

log = logging.getLogger("sidecar.pgwire")

TX_CONTROL = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT",
                        "RELEASE", "PREPARE"})  # fmt: skip
# Texts classified and kept (the cache is emptied when full); longer texts are not kept.
CLASSIFIED_MAX = 4096
CLASSIFIED_TEXT_MAX = 16_384
type Classified = tuple[tuple[Statement, SqlRuleMatch | None], ...]
UNBOUND = (
    "no task is bound to this connection: run the agent under `sidecar exec` "
    "(it sets PGOPTIONS=-c sidecar.task=...)"
)
# What of a guarded statement's answer the agent is not given here: ReadyForQuery (the
# sidecar sends its own), a CopyInResponse (the session gave it to the agent when it
# came, or answered it with CopyFail) and a CopyBothResponse (answered with CopyFail).
_NOT_RELAYED = frozenset({b"Z", b"G", b"W"})
_DESCRIPTIONS = frozenset({b"T", b"G"})  # RowDescription, CopyInResponse
QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a COPY the client failed
# What a replayed COPY FROM STDIN asks the agent for when its record kept no
# CopyInResponse: rows in text format.
_TEXT_ROWS = messages.copy_in_response(text=True, columns=0)


def _copy_refusal(rule: str, statement: Statement | None = None) -> str:
    if statement is None:
        return (
            f"effect-sidecar: this query holds a statement rule {rule} records and a COPY "
            "whose rows go through the connection (FROM STDIN or TO STDOUT), which cannot "
            "go with it; nothing of the query was run. Send the COPY in a query of its own"
        )
    if statement.copies_from_agent():
        return (
            f"effect-sidecar: rule {rule} matches this COPY FROM STDIN, sent by the "
            "extended protocol (Parse, Bind, Execute); the sidecar records one sent as a "
            "simple query, as psql, psycopg and asyncpg send it, so the statement was not "
            "run. Send it without parameters as a simple query, or narrow the rule"
        )
    return (
        f"effect-sidecar: rule {rule} matches this COPY TO STDOUT, whose rows go to the "
        "agent through the connection; a record keeps a statement's command tag and "
        "rows, not a COPY stream, so the statement was not run. Narrow the rule so that "
        "it leaves this COPY out (reading rows is no side effect)"
    )


@dataclass
class PgEffects:
    """What every connection's engine shares: rules, bindings, the store, schemas made."""

    rules: RuleSet
    bindings: Bindings
    store: Store
    metrics: Metrics
    classified: dict[str, Classified] = field(default_factory=dict)
    mirrors: Mirrors = field(default_factory=Mirrors)
    ordinals: Ordinals = field(default_factory=Ordinals)
    store_retry_s: float = 2.0

    def __post_init__(self) -> None:
        self.recorder = Recorder(
            self.store, self.bindings, self.metrics, store_retry_s=self.store_retry_s
        )
        kinds = _kinds_needed(self.rules)
        self._might = None if kinds is None else _FirstLook(kinds)

    def engine(self, bind: BindRequest, database: str) -> Statements:
        return Statements(self, bind, database)

    def guards(self, sql: str) -> bool:
        if not self.might_guard(sql.encode()):
            return False  # most statements stop here, unparsed
        return any(match is not None for _, match in self.classify(sql))

    def classify(self, sql: str) -> Classified:
        """Each statement of ``sql``, parsed, with the rule that records it (or None).

        Parsed and matched once per text: the session asks whether a query is guarded,
        then the engine runs it, and agents send the same texts again and again."""
        known = self.classified.get(sql)
        if known is None:
            statements = (Statement.of(text) for text in split(sql))
            known = tuple((statement, self.match(statement)) for statement in statements)
            if len(sql) <= CLASSIFIED_TEXT_MAX:
                keep(self.classified, sql, known, CLASSIFIED_MAX)
        return known

    def might_guard(self, sql: bytes) -> bool:
        """A first look, cheap enough for every query: False only when no rule can match.

        One statement with no leading comment is judged by its first word; anything else
        (comments, several statements, a rule with no kind) is looked at closely."""
        return self._might is None or self._might(sql)

    def match(self, statement: Statement) -> SqlRuleMatch | None:
        found = self.rules.match_sql(statement)
        if found is None or found.rule.effect is not EffectKind.NON_IDEMPOTENT:
            return None
        return found


@dataclass
class _Query:
    """A simple Query being run: the answer so far, and the transaction the sidecar holds."""

    out: bytearray = field(default_factory=bytearray)
    ours_open: bool = False  # the sidecar's own transaction is open (or its BEGIN owed)
    begin_sent: bool = False
    # Requests of the sidecar's own, each ending with Sync, not sent yet: they go with the
    # next one (BEGIN with the first request, a record's completion with COMMIT).
    owed: list[list[bytes]] = field(default_factory=list)
    in_ours: list[Done] = field(default_factory=list)  # recorded inside our transaction
    committed: list[Done] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Sent:
    """Requests of the sidecar's own on their way: how many owed ones went first (BEGIN,
    a record's completion), whether any will be answered, the messages sent, and the
    Close messages still owed from earlier that went before them."""

    owed: int
    answerable: bool
    messages: tuple[bytes, ...]
    carried: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class _Wire:
    """How one guarded statement travels, for :meth:`Statements._guarded`: the simple
    protocol (requests end with Sync; the answer is gathered for one reply) or the
    extended one (requests end with Flush, the agent's own Sync follows; the answer goes
    to the agent as it comes)."""

    ask: Callable[..., Awaitable[list[Message]]]  # the sidecar's own request, answered
    send: Callable[..., _Sent]  # ... sent, its answers collected by ``collect``
    collect: Callable[[_Sent], Awaitable[list[Message]]]
    run: Callable[[], Awaitable[list[Message]]]  # the agent's statement, answered
    answer: Callable[[bytes], None]  # what the agent gets for it
    complete: Callable[[list[bytes]], Awaitable[None]]  # the record's completion
    ensure_schema: Callable[[], Awaitable[None]]
    simple: bool
    # The statement is alone in a transaction of the sidecar's own, which ``abandon``
    # rolls back: its record can travel with it (see Statements._with_statement).
    abandon: Callable[[], Awaitable[None]] | None = None
    # A COPY FROM STDIN (simple protocol): its first run streams the agent's rows to the
    # server; a replay asks the agent for them with the recorded CopyInResponse, and
    # swallows them (see Statements._take_rows).
    take_rows: Callable[[bytes], Awaitable[None]] | None = None


class Statements:
    """The engine of one agent connection (see the module docstring)."""

    def __init__(self, shared: PgEffects, bind: BindRequest, database: str) -> None:
        self.shared = shared
        self.bind = bind
        self.database = database
        self.mirror = LogMirror(shared.recorder, database, shared.mirrors)
        self.uncommitted: list[Done] = []  # recorded inside a transaction the agent owns
        # Close messages the server skipped (a request of the sidecar's own failed in the
        # extended protocol): they go with its next request (see _collect_extended), or
        # before the next simple Query it runs.
        self.unclosed: list[bytes] = []
        # The schema was created in the transaction now open: it exists for every other
        # connection only once that transaction commits (see ready()).
        self.schema_in_transaction = False
        # The sidecar's table was seen (or made, and committed) on this connection: looked
        # for once per connection, not once per database name, since a database dropped
        # and created again under the same name (a reset between runs) has lost it.
        self.schema_seen = False

    def might_guard(self, sql: bytes) -> bool:
        return self.shared.might_guard(sql)

    def guards(self, sql: str) -> bool:
        return self.shared.guards(sql)

    # ---- simple query protocol ------------------------------------------------------

    async def simple(self, conversation: Conversation, sql: str, raw: bytes) -> None:
        await conversation.wait_idle()  # the transaction status must be known
        if self.unclosed:  # (a Sync inside the agent's transaction does not end it)
            closes, self.unclosed = self.unclosed, []
            await conversation.ask(*closes, messages.SYNC)
        classified = self.shared.classify(sql)
        statements = [statement for statement, _ in classified]
        # A multi-statement Query is one implicit transaction: keep it one.  With explicit
        # transaction control inside it, each guarded statement is wrapped on its own.
        wrap_all = conversation.tracker.status == "I" and not any(
            s.kind in TX_CONTROL or NO_TRANSACTION.search(s.normalised) for s in statements
        )
        run = _Query()
        try:
            if len(classified) > 1 and any(s.copies_through_connection() for s in statements):
                # Its rows would come in the middle of the sidecar's requests for the rest.
                rule = next(match.rule.name for _, match in classified if match is not None)
                raise Refused("ES422", _copy_refusal(rule))
            binding = await self._binding()
            if wrap_all:
                self._begin(run)
            alone = len(classified) == 1
            for statement, match in classified:
                if not await self._one(conversation, binding, statement, match, run, alone):
                    break
            else:
                if run.ours_open:
                    await self._commit(conversation, run)
        except Refused as refused:
            if not run.ours_open:
                await self._fail_transaction(conversation)
            run.out += messages.error_response(refused.code, refused.text)
        if run.ours_open:
            await self._rollback(conversation, run)  # something failed inside our wrap
        for done in run.committed:
            self._ended(done, committed=True)
        for done in run.in_ours:
            self._ended(done, committed=False)
        run.out += messages.ready_for_query(conversation.tracker.status)
        conversation.send_client(bytes(run.out))

    async def _one(
        self,
        conversation: Conversation,
        binding: Binding,
        statement: Statement,
        match: SqlRuleMatch | None,
        run: _Query,
        alone: bool = False,
    ) -> bool:
        """One statement of a simple Query (``alone``: the only one); False if it failed
        (the rest is skipped)."""
        if match is None:
            answers = await self._ask(conversation, run, messages.query(statement.text))
            run.out += b"".join(a.raw for a in answers if a.kind != b"Z")
            return not any(a.kind == b"E" for a in answers)
        wrap_one = not run.ours_open and conversation.tracker.status == "I"
        if wrap_one and NO_TRANSACTION.search(statement.normalised):
            answer, succeeded = await self._outside_transaction(
                conversation, binding, match, statement,
                lambda: self._ask(conversation, run, messages.query(statement.text)),
            )  # fmt: skip
            run.out += answer
            return succeeded
        if wrap_one:
            self._begin(run)
        # Nothing else runs in the transaction the sidecar opened for it: if its record is
        # there already, that transaction can be rolled back whole.
        alone = alone and run.ours_open and not run.in_ours
        done = await self._guarded_simple(conversation, binding, match, statement, run, alone)
        if done is None:
            return False
        if isinstance(done, Done):
            (run.in_ours if run.ours_open else self.uncommitted).append(done)
        if wrap_one:
            await self._commit(conversation, run)
        return True

    async def _guarded_simple(
        self,
        conversation: Conversation,
        binding: Binding,
        match: SqlRuleMatch,
        statement: Statement,
        run: _Query,
        alone: bool,
    ) -> Done | bool | None:
        """Run (or replay) one guarded statement, its answer added to ``run.out``: its
        Done if it ran, True if replayed, None if it failed."""

        async def complete(request: list[bytes]) -> None:
            if run.ours_open:
                run.owed.append(request)  # goes with our COMMIT
                return
            answers = await self._ask(conversation, run, *request)
            records.raise_on_error(answers, "cannot complete the record in effect_sidecar.effects")

        def answer(raw: bytes) -> None:
            run.out += raw

        async def take_rows(asked: bytes) -> None:
            await self._take_rows(conversation, asked)

        copied = statement.copies_from_agent()
        wire = _Wire(
            ask=lambda *parts: self._ask(conversation, run, *parts),
            send=lambda *parts: self._send(conversation, run, *parts),
            collect=lambda sent: self._collect(conversation, sent),
            run=lambda: self._ask(conversation, run, messages.query(statement.text)),
            answer=answer,
            complete=complete,
            ensure_schema=lambda: self._ensure_schema(conversation, run),
            simple=True,
            abandon=(lambda: self._rollback(conversation, run)) if alone else None,
            take_rows=take_rows if copied else None,
        )
        if copied:
            # Its rows go to the server once it asks for them (the session sees to that).
            conversation.copy_in = CopyIn(forward=True)
        key = self._take(binding, statement, redaction.effect_key(match, statement))
        try:
            return await self._guarded(wire, binding, match, statement, key)
        except BaseException:
            self._give_back(binding, key)  # refused or broken: nothing of it committed
            raise
        finally:
            conversation.copy_in = None

    async def _guarded(
        self,
        wire: _Wire,
        binding: Binding,
        match: SqlRuleMatch,
        statement: Statement,
        key: str,
    ) -> Done | bool | None:
        """Record, then replay or run one guarded statement, whichever protocol carries
        it: its Done if it ran, True if it was answered from its record, None if it
        failed.  The effect is logged pending while the record is inserted, and that
        write is awaited before the statement may run; a statement alone in the
        sidecar's own transaction has it awaited before the record goes, which then
        travels with the statement."""
        if statement.copies_through_connection() and wire.take_rows is None:
            raise Refused("ES422", _copy_refusal(match.rule.name, statement))
        failpoints.reach("sql.before_pending", match.rule.name)
        await wire.ensure_schema()
        values = records.record_values(
            binding.task, key, binding.attempt_id, binding.generation,
            redaction.redacted_text(statement.text),  # no password literal kept in clear
        )  # fmt: skip
        if wire.abandon is not None:
            logged = await self.mirror.pending(binding, match, key, statement)
            if logged is None:  # (its record is made there, to go with the statement)
                return await self._with_statement(wire, binding, match, key, statement, values)
            # An earlier try: its record decides first.
            answers = await wire.ask(*records.request(records.RECORD, values, sync=wire.simple))
        else:
            # The record goes out, and while the server inserts it the effect is logged
            # pending - awaited here, not in a task of its own, which would wake this one
            # a loop turn after the store answered.
            sent = wire.send(*records.request(records.RECORD, values, sync=wire.simple))
            try:
                logged = await self.mirror.pending(binding, match, key, statement)
            finally:
                answers = await wire.collect(sent)  # before anything else is sent
        self._check_record(answers)
        if not records.is_new(answers):
            return await self._replay(wire, binding, match, key, logged)
        await self.mirror.run_again(binding, key, logged)
        failpoints.reach("sql.before_statement", match.rule.name)
        _log_forwarded(binding, key, match.rule.name)
        return await self._ran(wire, binding, match, key, await wire.run())

    async def _with_statement(
        self,
        wire: _Wire,
        binding: Binding,
        match: SqlRuleMatch,
        key: str,
        statement: Statement,
        values: list[str],
    ) -> Done | bool | None:
        """A new effect (its pending write is durable, and the log knew nothing of it) of
        a statement alone in the sidecar's own transaction: its record and the statement
        go in one round trip.  The record is inserted with no ON CONFLICT: if one is there
        already (another sidecar's, or the log lost it), the insert fails the
        transaction, the server skips the statement, and the transaction is rolled back
        before the recorded answer is replayed - the statement never runs twice."""
        assert wire.abandon is not None
        failpoints.reach("sql.before_statement", match.rule.name)
        _log_forwarded(binding, key, match.rule.name)
        record = records.request(records.RECORD_OR_FAIL, values, sync=True)
        answers = await wire.ask(*record, messages.query(statement.text))
        ready = next(i for i, a in enumerate(answers) if a.kind == b"Z")
        recorded, answers = answers[: ready + 1], answers[ready + 1 :]
        if b"E" in [a.kind for a in recorded]:
            await wire.abandon()
            if records.already_recorded(recorded):
                return await self._replay(wire, binding, match, key, None)
        self._check_record(recorded)
        return await self._ran(wire, binding, match, key, answers)

    async def _replay(
        self,
        wire: _Wire,
        binding: Binding,
        match: SqlRuleMatch,
        key: str,
        logged: EffectState | None,
    ) -> bool:
        """Answer a statement whose record is committed: from that record."""
        recall = records.request(records.RECALL, [binding.task, key], sync=wire.simple)
        answers = await wire.ask(*recall)
        records.raise_on_error(answers, "cannot read effect_sidecar.effects")
        recalled = records.recalled(answers)
        if wire.take_rows is not None:
            await wire.take_rows(recalled.row_description)  # kept: its CopyInResponse
        self._replayed(binding, key, logged, recalled.tag, match.rule.name)
        wire.answer(recalled.answer(simple=wire.simple and wire.take_rows is None))
        return True

    async def _take_rows(self, conversation: Conversation, asked: bytes) -> None:
        """A replayed COPY FROM STDIN: the agent is asked for its rows as its first run
        asked for them (``asked``: the recorded CopyInResponse), and they are swallowed.
        The agent's CopyFail fails the statement, as PostgreSQL's own answer would."""
        copy = CopyIn(forward=False)
        conversation.send_client(asked if asked[:1] == b"G" else _TEXT_ROWS)
        conversation.rows_from_agent(copy)
        last = await copy.ended
        if last[:1] != b"c":  # CopyFail: its reason, a NUL-terminated string
            reason = last[5:].rstrip(b"\0").decode(errors="replace")
            raise Refused(QUERY_CANCELED, f"COPY from stdin failed: {reason}")

    async def _ran(
        self,
        wire: _Wire,
        binding: Binding,
        match: SqlRuleMatch,
        key: str,
        answers: list[Message],
    ) -> Done | None:
        """The statement's answer: relayed, and its record completed if it succeeded."""
        done = Done(binding, key, match.rule.name, records.command_tag(answers))
        # (List comprehensions, not generators: run inline, with no frame per answer.)
        relayed = b"".join([a.raw for a in answers if a.kind not in _NOT_RELAYED])
        if b"E" in [a.kind for a in answers]:
            wire.answer(relayed)
            self._failed(done, answers)
            return None
        failpoints.reach("sql.after_statement", match.rule.name)
        # (An Execute's answer has no RowDescription: Describe gave it to the agent.  A
        # COPY FROM STDIN's CopyInResponse is kept in its place, to ask a replay's rows.)
        description = b"".join([a.raw for a in answers if a.kind in _DESCRIPTIONS])
        rows = b"".join([a.raw for a in answers if a.kind == b"D"])
        values = records.complete_values(binding.task, key, done.tag, description, rows)
        await wire.complete(records.request(records.COMPLETE, values, sync=wire.simple))
        wire.answer(relayed)
        return done

    async def _outside_transaction(
        self,
        conversation: Conversation,
        binding: Binding,
        match: SqlRuleMatch,
        statement: Statement,
        run_it: Callable[[], Awaitable[list[Message]]],
        parameters: tuple[bytes | None, ...] = (),
    ) -> tuple[bytes, bool]:
        """A statement PostgreSQL will not run in a transaction block (CREATE INDEX
        CONCURRENTLY, VACUUM, ...) cannot share one with a record: it gets the HTTP flow
        instead - logged pending, run, logged completed before the agent is answered, and
        replayed from the effect log.  A crash between running and logging leaves it
        unknown and the next attempt runs it again: the one window the other statements do
        not have.  Returns the answer for the agent (its own or the recorded one), and
        whether the statement succeeded."""
        key = self._take(binding, statement, redaction.effect_key(match, statement, parameters))
        try:
            return await self._run_outside_transaction(binding, match, statement, run_it, key)
        except BaseException:
            self._give_back(binding, key)
            raise

    async def _run_outside_transaction(
        self,
        binding: Binding,
        match: SqlRuleMatch,
        statement: Statement,
        run_it: Callable[[], Awaitable[list[Message]]],
        key: str,
    ) -> tuple[bytes, bool]:
        failpoints.reach("sql.before_pending", match.rule.name)
        logged = await self.mirror.pending_effect(binding, match, key, statement)
        state = None if logged is None else logged.state
        if logged is not None and logged.state is EffectState.COMPLETED:
            tag = dict(logged.response.headers if logged.response else ()).get("x-command-tag")
            self._replayed(binding, key, state, tag or "", match.rule.name)
            return messages.command_complete(tag or ""), True
        await self.mirror.run_again(binding, key, state)
        failpoints.reach("sql.before_statement", match.rule.name)
        _log_forwarded(binding, key, match.rule.name)
        answers = await run_it()
        done = Done(binding, key, match.rule.name, records.command_tag(answers))
        succeeded = not any(a.kind == b"E" for a in answers)
        if succeeded:
            failpoints.reach("sql.after_statement", match.rule.name)
            await self.mirror.completed_now(done)
            self.shared.ordinals.kept(binding.task, binding.attempt_id, key)
        else:
            self._failed(done, answers)
        return b"".join(a.raw for a in answers if a.kind != b"Z"), succeeded

    def _begin(self, run: _Query) -> None:
        run.ours_open, run.begin_sent = True, False
        run.owed.append([messages.query("BEGIN")])

    async def _commit(self, conversation: Conversation, run: _Query) -> None:
        """COMMIT our transaction; if it rolled back, relay the error, mirror as failed."""
        if not run.begin_sent:
            run.owed.clear()  # nothing ran in it: nothing to commit
            run.ours_open = False
            return
        answers = await self._ask(conversation, run, messages.query("COMMIT"))
        run.ours_open = False
        failed = [a for a in answers if a.kind == b"E"]
        run.out += b"".join(a.raw for a in failed)
        if failed or records.command_tag(answers) != "COMMIT":
            return  # in_ours stay, and are mirrored as failed
        for done in run.in_ours:
            failpoints.reach("sql.after_commit", done.rule)
        run.committed += run.in_ours
        run.in_ours.clear()

    async def _rollback(self, conversation: Conversation, run: _Query) -> None:
        run.owed.clear()
        run.ours_open = False
        if run.begin_sent:
            run.begin_sent = False
            await conversation.ask(messages.query("ROLLBACK"))

    async def _ask(self, conversation: Conversation, run: _Query, *parts: bytes) -> list[Message]:
        """Send ``parts`` after what ``run`` still owes; the answers to ``parts``.

        A failure of an owed request (BEGIN, a record's completion) is a refusal: the
        transaction it belongs to is failed, whatever ``parts`` were.
        """
        return await self._collect(conversation, self._send(conversation, run, *parts))

    def _send(self, conversation: Conversation, run: _Query, *parts: bytes) -> _Sent:
        """Send ``parts`` after what ``run`` still owes, without waiting for answers."""
        owed, run.owed = run.owed, []
        run.begin_sent = run.begin_sent or (run.ours_open and bool(owed))
        flat = (*[raw for request in owed for raw in request], *parts)
        return _Sent(len(owed), conversation.send(*flat), flat)

    async def _collect(self, conversation: Conversation, sent: _Sent) -> list[Message]:
        """The answers to what :meth:`_send` sent, past those of the owed requests.

        A request of the sidecar's own that failed (a record, its completion, a replay's
        read) had its Close messages skipped by the server, and a statement prepared by
        Parse outlives the transaction that failed: they go again, at once."""
        answers = await conversation.answers(sent.answerable)
        if b"E" in [a.kind for a in answers] and (
            closes := records.failed_closes(sent.messages, answers)
        ):
            await conversation.ask(*closes, messages.SYNC)
        for _ in range(sent.owed):
            ready = next(i for i, a in enumerate(answers) if a.kind == b"Z")
            mine, answers = answers[: ready + 1], answers[ready + 1 :]
            records.raise_on_error(mine, "effect-sidecar's own request failed")
        return answers

    # ---- extended query protocol ----------------------------------------------------

    async def execute(self, conversation: Conversation, portal: Portal, raw: bytes) -> None:
        # A Parse message holds one statement (PostgreSQL refuses more), classified when
        # the session asked whether it is guarded.
        ((statement, match),) = self.shared.classify(portal.statement.sql)
        assert match is not None  # the session only hands over guarded statements
        parameters = portal.bind.parameters if portal.bind else ()
        try:
            binding = await self._binding()
        except Refused as refused:
            await self._refuse_extended(conversation, refused)
            return
        if NO_TRANSACTION.search(statement.normalised):
            try:
                answer, _ = await self._outside_transaction(
                    conversation, binding, match, statement,
                    lambda: conversation.ask(raw, messages.FLUSH), tuple(parameters),
                )  # fmt: skip
            except Refused as refused:
                await self._refuse_extended(conversation, refused)
                return
            conversation.send_client(answer)
            return
        key = self._take(binding, statement, redaction.effect_key(match, statement, parameters))
        try:
            await self._execute(conversation, binding, match, statement, raw, key)
        except BaseException:
            self._give_back(binding, key)
            raise

    async def _execute(
        self,
        conversation: Conversation,
        binding: Binding,
        match: SqlRuleMatch,
        statement: Statement,
        raw: bytes,
        key: str,
    ) -> None:
        async def complete(request: list[bytes]) -> None:
            answers = await self._ask_extended(conversation, *request)
            records.raise_on_error(answers, "cannot complete the record in effect_sidecar.effects")

        wire = _Wire(
            ask=lambda *parts: self._ask_extended(conversation, *parts),
            send=lambda *parts: self._send_extended(conversation, *parts),
            collect=lambda sent: self._collect_extended(conversation, sent),
            run=lambda: conversation.ask(raw, messages.FLUSH),
            answer=conversation.send_client,
            complete=complete,
            ensure_schema=lambda: self._ensure_schema(conversation, None),
            simple=False,
        )
        try:
            done = await self._guarded(wire, binding, match, statement, key)
        except Skipped:
            self._give_back(binding, key)
            return  # an earlier message of this batch failed: the server skips to Sync
        except Refused as refused:
            self._give_back(binding, key)
            await self._refuse_extended(conversation, refused)
            return
        if isinstance(done, Done):
            self.uncommitted.append(done)

    async def _refuse_extended(self, conversation: Conversation, refused: Refused) -> None:
        if not refused.by_server:
            # Make the server fail this transaction too, so it skips the rest of the
            # agent's messages up to Sync exactly as after any error.  (A request the
            # server failed did that already: it would skip this one too, unanswered.)
            await self._ask_extended(
                conversation, *records.request(records.REFUSED, [], sync=False)
            )
        conversation.send_client(messages.error_response(refused.code, refused.text))

    async def _ask_extended(self, conversation: Conversation, *parts: bytes) -> list[Message]:
        """A request of the sidecar's own in the extended protocol (it ends with Flush: a
        Sync would end the agent's transaction); its answers."""
        return await self._collect_extended(conversation, self._send_extended(conversation, *parts))

    def _send_extended(self, conversation: Conversation, *parts: bytes) -> _Sent:
        """:meth:`_ask_extended` without waiting; the Close messages still owed go first."""
        carried, self.unclosed = tuple(self.unclosed), []
        return _Sent(0, conversation.send(*carried, *parts), parts, carried)

    async def _collect_extended(self, conversation: Conversation, sent: _Sent) -> list[Message]:
        """The answers to what :meth:`_send_extended` sent.  If a request failed (or was
        skipped) the server skipped its Close messages too, and the statement it prepared
        outlives the transaction; they cannot go at once - until the agent's Sync the
        server skips everything, and a Sync of the sidecar's own would end the agent's
        transaction - so they go with the sidecar's next request on this connection."""
        answers = await conversation.answers(sent.answerable)
        kinds = [a.kind for a in answers]
        if SKIPPED in kinds:  # none of it ran, the Close messages carried neither
            self.unclosed += [*sent.carried, *records.closes(sent.messages)]
        elif b"E" in kinds:  # those carried went first, and ran
            self.unclosed += records.closes(sent.messages)
        return answers

    def ready(self, status: str, committed: bool | None) -> None:
        if status != "I":
            return
        if self.schema_in_transaction and committed:
            self.schema_seen = True
        self.schema_in_transaction = False
        ended, self.uncommitted = self.uncommitted, []
        for done in ended:
            if committed is None:  # PREPARE TRANSACTION: neither committed nor rolled back
                self.shared.ordinals.kept(done.binding.task, done.binding.attempt_id, done.key)
                self.mirror.in_doubt(done)
                continue
            if committed:
                failpoints.reach("sql.after_commit", done.rule)
            self._ended(done, committed)

    def closed(self) -> None:
        # What the mirror holds back goes now: the agent's next move (its exit, then
        # `sidecar exec` releasing the lease) must find it already queued in the store.
        self.mirror.flush()

    # ---- keys and what becomes of them (ordinals) ------------------------------------

    def _take(self, binding: Binding, statement: Statement, base: str) -> str:
        if statement.comment_key is not None:
            return base  # named by the agent (/* sidecar:key=NAME */): once per task
        return self.shared.ordinals.take(binding.task, binding.attempt_id, base)

    def _give_back(self, binding: Binding, key: str) -> None:
        self.shared.ordinals.give_back(binding.task, binding.attempt_id, key)

    def _replayed(
        self, binding: Binding, key: str, logged: EffectState | None, tag: str, rule: str
    ) -> None:
        self.shared.ordinals.kept(binding.task, binding.attempt_id, key)
        self.mirror.replayed(binding, key, logged, tag, rule)

    def _failed(self, done: Done, answers: list[Message]) -> None:
        self._give_back(done.binding, done.key)
        self.mirror.failed(done, answers)

    def _ended(self, done: Done, committed: bool) -> None:
        if committed:
            self.shared.ordinals.kept(done.binding.task, done.binding.attempt_id, done.key)
        else:
            self._give_back(done.binding, done.key)
        self.mirror.ended(done, committed)

    # ---- the sidecar's own statements -----------------------------------------------

    async def _ensure_schema(self, conversation: Conversation, run: _Query | None) -> None:
        if self.schema_seen or self.schema_in_transaction:
            return

        async def ask(sql: str) -> list[Message]:
            request = records.request(sql, [], sync=run is not None)
            if run is None:
                answers = await self._ask_extended(conversation, *request)
            else:
                answers = await self._ask(conversation, run, *request)
            records.raise_on_error(answers, "cannot create the effect_sidecar schema")
            return answers

        if records.schema_exists(await ask(records.SCHEMA_EXISTS)):
            self.schema_seen = True
            return
        for sql in records.SCHEMA:
            await ask(sql)
        self.schema_in_transaction = True

    def _check_record(self, answers: list[Message]) -> None:
        if records.lost_table(answers):
            # Dropped behind the sidecar's back on this connection (DROP SCHEMA): make it
            # again next time instead of failing every statement from now on.
            self.schema_seen = False
        records.raise_on_error(answers, "cannot record the statement in effect_sidecar.effects")

    async def _fail_transaction(self, conversation: Conversation) -> None:
        if conversation.tracker.status == "T":
            # The agent's transaction is now failed, as after any error of its own.
            await conversation.ask(messages.query(records.REFUSED))

    async def _binding(self) -> Binding:
        """The connection's binding, fenced and self-fenced by the recording layer; its
        refusals as the ErrorResponse codes the agent sees (``ES`` + the HTTP status)."""
        what = f"SQL on database {self.database}"
        recorder = self.shared.recorder
        try:
            binding = await recorder.bind(self.bind, what, "postgres")
            if binding is None:
                raise Refused("ES428", UNBOUND)
            await recorder.admit(binding, what, "postgres")
        except StaleGeneration as stale:
            raise Refused("ES409", f"effect-sidecar: {stale.detail}") from stale
        except SidecarError as error:
            raise Refused("ES" + str(error.status), f"effect-sidecar: {error.detail}") from error
        return binding


class _FirstLook:
    """Whatever could make a query one a rule records: a leading keyword some rule names,
    a leading comment, a second statement (a ``;`` with more than spaces and ``;`` after
    it), a keyed comment.  A query it does not find is relayed without being decoded or
    parsed, so it runs for every query: the anchored match and two byte searches take
    two thirds of the time of one search for the three (``;`` found first, the rest of
    the text looked at only from there)."""

    def __init__(self, kinds: frozenset[str]) -> None:
        # Longest first, so that a keyword is never cut short by another it starts with.
        words = sorted((re.escape(kind.encode()) for kind in kinds), key=len, reverse=True)
        leading = [b"--", rb"/\*"]
        if words:
            leading.append(b"(?:" + b"|".join(words) + b")(?![A-Za-z])")
        self._leading = re.compile(rb"\s*(?:" + b"|".join(leading) + b")", re.IGNORECASE)

    def __call__(self, sql: bytes) -> bool:
        if self._leading.match(sql) is not None or b"sidecar:key" in sql:
            return True
        semi = sql.find(b";")
        return semi >= 0 and _MORE_AFTER.search(sql, semi) is not None


#: A ``;`` with a statement after it (not only spaces and empty statements).
_MORE_AFTER = re.compile(rb";[\s;]*[^\s;]")


def _kinds_needed(rules: RuleSet) -> frozenset[str] | None:
    """The statement kinds some SQL rule records (a keyed comment is looked for apart),
    or None when a rule with no kind (a bare regex) could match any statement."""
    kinds: set[str] = set()
    for rule in rules.rules:
        if rule.sql is None or rule.effect is not EffectKind.NON_IDEMPOTENT:
            continue
        condition = rule.sql.sql
        if condition.kind:
            kinds.update(condition.kind)
        elif not condition.comment:
            return None
    return frozenset(kinds)


def _log_forwarded(binding: Binding, key: str, rule: str) -> None:
    """The one log line per statement sent (``sidecar matrix`` counts them).  Its fields
    are gathered only when it will be written: per recorded statement, that is a dict
    and a logger call for nothing at the usual levels."""
    if log.isEnabledFor(logging.INFO):
        extra = {"task": binding.task, "attempt_id": binding.attempt_id, "rule": rule,
                 "effect_key": key}  # fmt: skip
        log.info("statement forwarded", extra=extra)
