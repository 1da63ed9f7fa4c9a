"""The engine every pattern from a rule file runs on: RE2, linear in the text it reads.

A backtracking engine (Python's ``re``) can take exponential time on a pattern such as
``^(a|aa)+$``, and rules are matched on the event loop that serves every request: one
such pattern would stall the proxy.  RE2 never backtracks.  What it cannot do -
backreferences, lookaround, atomic groups, possessive quantifiers - is refused when the
rules are loaded, saying what to write instead.  The product's own fixed patterns stay
on ``re``, and so do the patterns it makes of path templates, which cannot backtrack
badly (``sidecar.rules.patterns`` says why).

Texts are handed to RE2 as UTF-8 bytes with lone surrogates passed through (mitmproxy
decodes raw bytes in a path with ``surrogateescape``), and captured groups come back as
``str`` the same way: a request that is not valid UTF-8 still matches, never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from sidecar.rules.templates import TemplateSyntaxError

_UNSUPPORTED = "which the linear-time matcher (RE2) does not support"
# RE2's error texts, by what the pattern meant: what it says, and what to do instead.
_WHY: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"invalid escape sequence: \\[1-9]|invalid perl operator: \(\?P$"),  # \1, (?P=n)
        f"uses a backreference, {_UNSUPPORTED}",
    ),
    (
        re.compile(r"invalid perl operator: \(\?<?[=!]"),
        f"uses a lookahead or lookbehind, {_UNSUPPORTED}; to leave some requests or "
        "statements out, put a rule with 'effect: read' matching them before this one",
    ),
    (
        re.compile(r"invalid perl operator: \(\?>|bad repetition operator: [*+?}]\+"),
        f"uses an atomic group or a possessive quantifier, {_UNSUPPORTED} (nor needs: it "
        "never backtracks)",
    ),
    (re.compile(r"invalid escape sequence: \\Z"), "uses \\Z: write \\z for the end of the text"),
)


def _options(ignore_case: bool) -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print to stderr; the loader reports it instead
    options.case_sensitive = not ignore_case
    return options


def _reason(source: str, error: Exception) -> str:
    raw = error.args[0] if error.args else ""
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    for found, why in _WHY:
        if found.search(message):
            return f"pattern {source!r} {why}"
    return f"invalid regular expression {source!r}: {message}"


def _text(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _str(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class LinearMatch:
    """One match: its groups, by number or name, as ``str``."""

    _match: Any

    def group(self, group: int | str = 0) -> str | None:
        """The group's text, None if it did not take part; IndexError if there is none."""
        return _str(self._match.group(group))

    def groups(self) -> tuple[str | None, ...]:
        """Every group's text, in order (None for one that did not take part)."""
        return tuple(_str(value) for value in self._match.groups())

    def groupdict(self) -> dict[str, str | None]:
        # One call for all the groups: RE2's binding rebuilds its name index on each
        # group(name) (~2.6 us a name), its groups() is one call.
        values = self._match.groups()
        return {name: _str(values[at - 1]) for name, at in self._match.re.groupindex.items()}


@dataclass(frozen=True, slots=True)
class LinearPattern:
    """A compiled rule pattern; ``source`` is the pattern as the rule file wrote it.

    Two are equal when their source and case rule are (RE2's objects compare by identity).
    """

    source: str
    ignore_case: bool
    _regexp: Any = field(compare=False, repr=False)

    def search(self, text: str) -> LinearMatch | None:
        return self._wrap(self._regexp.search(_text(text)))

    def fullmatch(self, text: str) -> LinearMatch | None:
        return self._wrap(self._regexp.fullmatch(_text(text)))

    @staticmethod
    def _wrap(found: Any) -> LinearMatch | None:
        return None if found is None else LinearMatch(found)


def compile_pattern(source: str, *, ignore_case: bool = False) -> LinearPattern:
    """``source`` compiled by RE2; raises :class:`TemplateSyntaxError` saying why not."""
    try:
        return LinearPattern(source, ignore_case, re2.compile(source, _options(ignore_case)))
    except re2.error as error:
        raise TemplateSyntaxError(_reason(source, error)) from None


def escape(text: str) -> str:
    """``text`` as a pattern matching exactly itself."""
    return str(re2.escape(text))
