"""Rules for SQL statements: which ones are effects, and what names one.

A statement is matched by its kind (the leading keyword, after comments: ALTER, CREATE,
INSERT, ...), by a regular expression over its normalised text (case-insensitive, as
SQL is), or by carrying a ``/* sidecar:key=... */`` comment; every condition given must
hold.  Its effect key is, in order of precedence: the comment's key; the rule's ``key``
template (``{group.N}`` or ``{group.NAME}`` from the regex, ``{param.N}`` the N-th bind
parameter, ``{kind}``, ``{fingerprint}``, PostgreSQL's own parse-tree hash via pglast,
which ignores constants);
else a hash of the statement's normalised text (spacing and comments do not matter;
constants do: ``VALUES (1)`` and ``VALUES (2)`` are two effects) plus a hash of its
bind parameters.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

from sidecar.rules.parsed import Parsed
from sidecar.rules.regex import LinearMatch, LinearPattern, compile_pattern

# Statements PostgreSQL refuses inside a transaction block: the relay cannot run them in
# one with their record, so it records them right after they run (and ``sidecar resume``
# knows such a statement is run again after a crash in between).
NO_TRANSACTION = re.compile(
    r"^(create|drop|reindex)\b.*\bconcurrently\b|^(vacuum|alter system)\b"
    r"|^(create|drop) (database|tablespace)\b|^reindex (database|system)\b",
    re.IGNORECASE,
)

# A COPY whose rows go through the connection, as the COPY sub-protocol's messages after
# the statement, not through a file or a program on the server.
_THROUGH_CONNECTION = re.compile(r"\b(from\s+stdin|to\s+stdout)\b", re.IGNORECASE)
_FROM_STDIN = re.compile(r"\bfrom\s+stdin\b", re.IGNORECASE)

_COMMENT_KEY = re.compile(r"/\*\s*sidecar:key=([^*]+?)\s*\*/")
_LEADING_COMMENTS = re.compile(r"\A(\s+|--[^\n]*\n?|/\*.*?\*/)*", re.DOTALL)
_COMMENTS = re.compile(r"/\*.*?\*/|--[^\n]*", re.DOTALL)
_KEYWORD = re.compile(r"[A-Za-z]*")
_PLACEHOLDER = re.compile(r"\{(group|param)\.(\w+)\}|\{(kind|fingerprint)\}")


def _regex(value: Any) -> LinearPattern:
    if isinstance(value, LinearPattern):
        return value
    # SQL keywords and unquoted names are case-insensitive: so is the match.  The engine is
    # linear-time: a rule's pattern cannot stall the relay (its errors are ValueErrors).
    return compile_pattern(str(value), ignore_case=True)


# The first word of every PostgreSQL statement (its documentation's "SQL Commands"): a
# rule's ``kind`` outside it could never match, most likely a typo.
_STATEMENT_WORDS = (
    "ABORT ALTER ANALYZE BEGIN CALL CHECKPOINT CLOSE CLUSTER COMMENT COMMIT COPY CREATE "
    "DEALLOCATE DECLARE DELETE DISCARD DO DROP END EXECUTE EXPLAIN FETCH GRANT IMPORT "
    "INSERT LISTEN LOAD LOCK MERGE MOVE NOTIFY PREPARE REASSIGN REFRESH REINDEX RELEASE "
    "RESET REVOKE ROLLBACK SAVEPOINT SECURITY SELECT SET SHOW START TABLE TRUNCATE "
    "UNLISTEN UPDATE VACUUM VALUES WITH"
)
STATEMENT_KINDS = frozenset(_STATEMENT_WORDS.split())


def _known_kind(kind: str) -> str:
    if kind not in STATEMENT_KINDS:
        close = difflib.get_close_matches(kind, STATEMENT_KINDS, n=1)
        known = (
            f"did you mean {close[0]}?" if close else f"one of {', '.join(sorted(STATEMENT_KINDS))}"
        )
        raise ValueError(
            f"{kind} is not the first word of any PostgreSQL statement, so the rule could "
            f"never match; {known}"
        )
    return kind


class SqlCondition(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    kind: tuple[str, ...] = ()
    regex: Annotated[LinearPattern, Parsed(_regex, lambda regex: regex.source)] | None = None
    comment: bool = Field(default=False, description="Only statements with a sidecar:key comment")
    key: str | None = None

    @field_validator("kind", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> tuple[str, ...]:
        kinds = [value] if isinstance(value, str) else list(value or [])
        if not all(isinstance(k, str) and k.isalpha() for k in kinds):
            raise ValueError("kind is a keyword or a list of keywords, e.g. [ALTER, CREATE]")
        return tuple(_known_kind(k.upper()) for k in kinds)

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None:
            for found in re.findall(r"\{([^}]*)\}", value):
                if not _PLACEHOLDER.fullmatch("{" + found + "}"):
                    raise ValueError(
                        f"{{{found}}} is not a SQL key placeholder: use {{group.N}}, "
                        "{group.NAME}, {param.N}, {kind} or {fingerprint}"
                    )
        return value

    def model_post_init(self, __context: Any) -> None:
        if not (self.kind or self.regex or self.comment):
            raise ValueError("say what statements to match: kind, regex or comment")


class SqlMatch(BaseModel):
    """``match: {sql: {...}}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sql: SqlCondition


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement as the rules see it."""

    text: str  # as sent, comments included
    kind: str  # leading keyword, upper-case
    normalised: str  # whitespace collapsed, comments removed
    comment_key: str | None

    @classmethod
    def of(cls, text: str) -> Statement:
        if "--" not in text and "/*" not in text:
            # No comment (most statements): nothing to strip or look for but whitespace.
            body = text.lstrip()
            kind = _KEYWORD.match(body)
            return cls(
                text,
                kind.group(0).upper() if kind else "",
                " ".join(body.split()).rstrip(";").strip(),
                None,
            )
        found = _COMMENT_KEY.search(text)
        body = _LEADING_COMMENTS.sub("", text)
        kind = _KEYWORD.match(body)
        words = _COMMENTS.sub(" ", body)
        return cls(
            text,
            kind.group(0).upper() if kind else "",
            " ".join(words.split()).rstrip(";").strip(),
            found.group(1).strip() if found else None,
        )

    def copies_through_connection(self) -> bool:
        """A ``COPY ... FROM STDIN`` or ``COPY ... TO STDOUT``: its rows travel as COPY
        messages after it, which a record (a command tag and rows) does not hold.  (A
        file name that reads "from stdin" counts too: a false alarm refuses a statement,
        it never lets one run unrecorded.)"""
        return self.kind == "COPY" and _THROUGH_CONNECTION.search(self.normalised) is not None

    def copies_from_agent(self) -> bool:
        """A ``COPY ... FROM STDIN``: its rows come from the client after it."""
        return self.kind == "COPY" and _FROM_STDIN.search(self.normalised) is not None

    def digest(self) -> str:
        """sha256 of the normalised text: the default name of the statement's effect."""
        return hashlib.sha256(self.normalised.encode()).hexdigest()[:16]

    def fingerprint(self) -> str:
        """PostgreSQL's parse-tree fingerprint: the same for statements differing only in
        constants."""
        pg = _parser()
        try:
            return str(pg.fingerprint(self.text))
        except pg.ParseError:
            return hashlib.sha256(self.normalised.encode()).hexdigest()[:16]


def _parser() -> ModuleType:
    """pglast's parser, loaded when a statement is first looked at: a sidecar without a
    PostgreSQL relay never pays its start-up time and memory."""
    return importlib.import_module("pglast.parser")


def split(sql: str) -> list[str]:
    """The statements of a simple Query, each with the comments that precede it."""
    if _plain_single(sql):
        return [sql.strip().strip(";").strip()]  # what the parser would cut out of it
    pg = _parser()
    try:
        slices = pg.split(sql, with_parser=False, only_slices=True)
    except pg.ParseError:
        return [sql]
    texts: list[str] = []
    start = 0
    for piece in slices:
        texts.append(sql[start : piece.stop].lstrip(" \t\r\n;").strip())
        start = piece.stop
    return [t for t in texts if t.strip().strip(";").strip()] or [sql]


def _plain_single(sql: str) -> bool:
    """One statement with no comment, no escape and its quotes paired (most texts): the
    parser, which the rest need, can be skipped (ASCII only: it and ``str.strip`` do not
    agree on every Unicode space)."""
    body = sql.strip().strip(";")
    return (
        bool(body.strip())
        and sql.isascii()
        and not any(c in body for c in _NEEDS_PARSER)
        and body.count("'") % 2 == 0
        and body.count('"') % 2 == 0
    )


_NEEDS_PARSER = (";", "--", "/*", "$", "\\")


def matches(condition: SqlCondition, statement: Statement) -> LinearMatch | bool:
    if condition.kind and statement.kind not in condition.kind:
        return False
    if condition.comment and statement.comment_key is None:
        return False
    if condition.regex is not None:
        found = condition.regex.search(statement.normalised)
        return found if found else False
    return True


def effect_key(
    rule_name: str,
    condition: SqlCondition,
    statement: Statement,
    found: LinearMatch | bool,
    parameters: tuple[bytes | None, ...] = (),
) -> str:
    if statement.comment_key is not None:
        return statement.comment_key
    params = hashlib.sha256(repr(parameters).encode()).hexdigest()[:16] if parameters else ""
    if condition.key is None:
        return f"sql:{statement.digest()}" + (f":{params}" if params else "")

    def value(m: re.Match[str]) -> str:
        source, name, builtin = m.group(1), m.group(2), m.group(3)
        if builtin == "kind":
            return statement.kind
        if builtin == "fingerprint":
            return statement.fingerprint()
        if source == "group" and isinstance(found, LinearMatch):
            group = found.group(int(name) if name.isdigit() else name)
            return group if group is not None else ""
        if source == "param" and name.isdigit() and 0 < int(name) <= len(parameters):
            raw = parameters[int(name) - 1]
            return "NULL" if raw is None else raw.decode(errors="replace")
        return ""

    return f"{rule_name}:" + _PLACEHOLDER.sub(value, condition.key)
