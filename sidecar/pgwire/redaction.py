"""SQL password literals kept out of what the sidecar writes down (SPEC §7).

A recorded statement is kept twice - in the effect log (``request.statement``) and in
``effect_sidecar.effects.statement`` in the agent's database - and its key may quote it
(a rule's ``{group.N}``).  ``CREATE ROLE app LOGIN PASSWORD 'hunter2'`` must be kept as
``CREATE ROLE app LOGIN PASSWORD '[redacted]'``; the statement sent to PostgreSQL is of
course the agent's own, untouched.

The password literals are found in PostgreSQL's own parse tree (pglast): every option
named ``password`` with a string argument (CREATE/ALTER ROLE, USER and GROUP, ENCRYPTED
PASSWORD, user mappings' OPTIONS), and a subscription's connection string when it holds
a password.  The parse tree gives where each literal starts; PostgreSQL's scanner gives
where it ends, whatever its quoting (``'...'``, ``E'...'``, ``$$...$$``, ``U&'...'``).
Only the literal is cut out: the rest of the text stays as the agent wrote it, and a
statement with no password literal is returned as it is (the same object).

A statement the parser refuses (it will fail on the server too, but it is recorded
before it runs) is judged by the scanner alone: a string right after the word PASSWORD
is a password.  One the scanner refuses too (an unterminated literal) is cut after its
first PASSWORD or CONNECTION word: anything after it may be the secret, nothing before
it can be.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

from pglast import ast
from pglast import parser as pg
from pglast.visitors import Ancestor, Visitor

from sidecar.rules.matcher import SqlRuleMatch
from sidecar.rules.sql import Statement

#: What a secret is replaced with (as the HTTP path's, :mod:`sidecar.proxy.redact`).
REDACTED = "[redacted]"
_LITERAL = f"'{REDACTED}'"
# A cheap first look: no statement without one of these words can hold a password literal.
_MAYBE = re.compile(r"password|connection", re.IGNORECASE)
_STRING = frozenset({"SCONST", "USCONST"})
_COMMENT = frozenset({"C_COMMENT", "SQL_COMMENT"})
# A libpq connection string with a password: ``password=...`` or a URI's ``user:pw@``.
_CONNINFO_SECRET = re.compile(r"password|://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)
_BODY = re.compile(r"\A(?:[EeNnBbXx]|[Uu]&)?'(.*)'\Z|\A(\$\w*\$)(.*)\2\Z", re.DOTALL)
_FROM_TEXT = re.compile(r"\{group\.")
_KEPT_MAX = 16_384


@dataclass(frozen=True, slots=True)
class Redacted:
    """A SQL text with its password literals cut out, and what was cut."""

    text: str
    secrets: tuple[str, ...] = ()  # the literals, as written and as values, longest first
    cut: bool = False  # unscanned: everything after PASSWORD (or CONNECTION) is gone

    def scrub(self, value: str) -> str:
        """``value`` (a key rendered from the statement) with no secret of it in clear.

        Each secret becomes ``[redacted:HASH]``: two passwords still make two keys, as
        they did before, and the hash says no more than the default key (a hash of the
        whole text) already does."""
        if self.cut:
            return f"{REDACTED}:{_hash(value)}"
        if not self.secrets:
            return value
        secrets = re.compile("|".join(map(re.escape, self.secrets)))  # longest first
        return secrets.sub(lambda m: f"[redacted:{_hash(m.group(0))}]", value)


def redact(sql: str) -> Redacted:
    """``sql`` (one statement or several) with each password literal replaced by
    ``'[redacted]'``; ``sql`` itself if it has none."""
    if not _may_hold_password(sql):
        return Redacted(sql)
    return _redact_kept(sql) if len(sql) <= _KEPT_MAX else _redact(sql)


def _may_hold_password(sql: str) -> bool:
    """:data:`_MAYBE`'s first look, made for every recorded statement: an ASCII text
    (nearly all) lower-cased and searched twice costs a tenth of the case-blind regex,
    which Unicode case rules (a long s is an ``s``) keep for the rest."""
    if sql.isascii():
        lowered = sql.lower()
        return "password" in lowered or "connection" in lowered
    return _MAYBE.search(sql) is not None


def redacted_text(sql: str) -> str:
    return redact(sql).text


def normalised(statement: Statement) -> str:
    """The statement's normalised text (as the effect log shows it), redacted.

    Redacted first, then normalised: normalising is not literal-aware (a ``--`` inside a
    password would cut the text after it, and leave its start)."""
    text = redact(statement.text).text
    return statement.normalised if text is statement.text else Statement.of(text).normalised


def effect_key(
    match: SqlRuleMatch, statement: Statement, parameters: tuple[bytes | None, ...] = ()
) -> str:
    """The rule's effect key for ``statement``, with no password in clear.

    Only a rule's ``key`` template with ``{group.N}`` can quote the statement's text; the
    default key is a hash, and a ``sidecar:key`` comment is named by the agent."""
    key = match.key(statement, parameters)
    rule = match.rule.sql
    template = None if rule is None else rule.sql.key
    if statement.comment_key is None and template is not None and _FROM_TEXT.search(template):
        return redact(statement.text).scrub(key)
    return key


# ---- finding the literals ---------------------------------------------------------------

type _Span = tuple[int, int, tuple[str, ...]]  # start, stop, the secret's spellings


def _redact(sql: str) -> Redacted:
    try:
        tokens = pg.scan(sql)
    except pg.ParseError:
        return _cut(sql)
    try:
        spans = _from_tree(sql, pg.parse_sql(sql), tokens)
    except pg.ParseError:
        spans = None
    if spans is None:  # not parsed, or a literal the tree names is not where it says
        spans = _from_tokens(sql, tokens)
    if not spans:
        return Redacted(sql)
    text = sql
    secrets: set[str] = set()
    for start, stop, spellings in sorted(spans, reverse=True):
        text = text[:start] + _LITERAL + text[stop:]
        secrets.update(s for s in spellings if s)
    return Redacted(text, tuple(sorted(secrets, key=lambda s: (-len(s), s))))


# A statement is redacted when logged pending and again when recorded: short texts are
# looked at once.
_redact_kept = lru_cache(maxsize=256)(_redact)


class _Found(Visitor):
    """The parse tree's password literals: (where the literal starts, its value)."""

    def __init__(self) -> None:
        self.found: list[tuple[int | None, str]] = []

    def visit(self, ancestors: Ancestor, node: ast.Node) -> None:
        if isinstance(node, ast.DefElem):
            password = (node.defname or "").lower() == "password"
            if password and isinstance(node.arg, ast.String):
                self.found.append((node.arg_location, node.arg.sval or ""))
        elif (
            isinstance(node, ast.CreateSubscriptionStmt | ast.AlterSubscriptionStmt)
            and node.conninfo
            and _CONNINFO_SECRET.search(node.conninfo)
        ):
            self.found.append((node.conninfo_location, node.conninfo))


def _from_tree(
    sql: str, statements: tuple[ast.RawStmt, ...], tokens: list[pg.Token]
) -> list[_Span] | None:
    starts = {token.start: n for n, token in enumerate(tokens)}
    spans: list[_Span] = []
    found = _Found()
    found(statements)
    for location, value in found.found:
        n = starts.get(location if location is not None else -1)
        if n is None or tokens[n].name not in _STRING:
            return None
        spans.append(_span(sql, tokens, n, value))
    return spans


def _from_tokens(sql: str, tokens: list[pg.Token]) -> list[_Span]:
    """Without a parse tree: a string right after PASSWORD (or a ``"password"`` option
    name), and a connection string holding a password right after CONNECTION."""
    words = [n for n, token in enumerate(tokens) if token.name not in _COMMENT]
    spans: list[_Span] = []
    for here, after in itertools.pairwise(words):
        word, literal = tokens[here], tokens[after]
        if literal.name not in _STRING:
            continue
        spelled = sql[word.start : word.end + 1]
        if word.name == "PASSWORD" or spelled.lower() == '"password"':
            spans.append(_span(sql, tokens, after, ""))
        elif word.name == "CONNECTION":
            found = _span(sql, tokens, after, "")
            if _CONNINFO_SECRET.search(sql[found[0] : found[1]]):
                spans.append(found)
    return spans


def _span(sql: str, tokens: list[pg.Token], n: int, value: str) -> _Span:
    """The literal starting at ``tokens[n]``, with its UESCAPE clause if it has one."""
    start, stop = tokens[n].start, tokens[n].end + 1
    following = itertools.islice(tokens, n + 1, None)
    rest = list(itertools.islice((t for t in following if t.name not in _COMMENT), 2))
    if len(rest) == 2 and rest[0].name == "UESCAPE" and rest[1].name == "SCONST":
        stop = rest[1].end + 1
    written = sql[tokens[n].start : tokens[n].end + 1]
    body = _BODY.match(written)
    inner = (body.group(1) if body.group(1) is not None else body.group(3)) if body else ""
    return start, stop, (written, inner, " ".join(inner.split()), value, " ".join(value.split()))


def _cut(sql: str) -> Redacted:
    found = _MAYBE.search(sql)
    assert found is not None  # redact() looked
    return Redacted(f"{sql[: found.end()]} {REDACTED}", cut=True)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]
