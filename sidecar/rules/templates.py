"""The small languages inside a rule file, each parsed once when the rules are loaded.

* :class:`Expression` - a JMESPath expression (``length(@) > `0```, ``[0]``).
* :class:`Template` - effect keys and probe parts: ``{owner}/{repo}#pull:{body.head}``.
* :class:`UrlTemplate` - a probe's ``path?query``, whose query values get URL-encoded.

A syntax error raises :class:`TemplateSyntaxError` (a ``ValueError``, so pydantic reports
it at the field that holds the text); a value a request does not carry raises
:class:`TemplateValueMissing` when rendering, and the caller decides what that means.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import jmespath
from jmespath import functions as jmespath_functions
from jmespath.exceptions import IncompleteExpressionError, JMESPathError, LexerError, ParseError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sidecar.rules.facts import HttpRequestFacts

PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # an HTTP header name (RFC 9110 token)
_FUNCTIONS = frozenset(jmespath_functions.Functions().FUNCTION_TABLE)
BUILTINS = frozenset({"method", "host", "path"})


class TemplateSyntaxError(ValueError):
    """A template, pattern or expression that cannot be parsed."""


class TemplateValueMissing(LookupError):
    """A placeholder has no value for this request."""

    def __init__(self, placeholder: str, reason: str) -> None:
        self.placeholder = placeholder
        self.reason = reason
        super().__init__(f"{{{placeholder}}}: {reason}")


@dataclass(frozen=True, slots=True)
class Expression:
    source: str
    compiled: jmespath.parser.ParsedResult

    @classmethod
    def compile(cls, source: str) -> Expression:
        if not source.strip():
            raise TemplateSyntaxError("invalid JMESPath: the expression is empty")
        try:
            compiled = jmespath.compile(source)
        except LexerError as error:
            raise TemplateSyntaxError(
                f"invalid JMESPath {source!r}: {error.message} at column {error.lexer_position}"
            ) from None
        except IncompleteExpressionError:
            raise TemplateSyntaxError(
                f"invalid JMESPath {source!r}: incomplete expression"
            ) from None
        except ParseError as error:
            raise TemplateSyntaxError(
                f"invalid JMESPath {source!r}: {error.msg} at column {error.lex_position}"
            ) from None
        except JMESPathError as error:
            first = str(error).splitlines()[0]
            raise TemplateSyntaxError(f"invalid JMESPath {source!r}: {first}") from None
        # jmespath resolves function names only when evaluating; a typo should fail now.
        for name in _function_names(compiled.parsed):
            if name not in _FUNCTIONS:
                raise TemplateSyntaxError(f"invalid JMESPath {source!r}: no function {name}()")
        return cls(source, compiled)

    def search(self, data: Any) -> Any:
        """Evaluate over ``data``; raises jmespath's ``JMESPathError`` on a type error."""
        return self.compiled.search(data)


def _function_names(node: Any) -> set[str]:
    names: set[str] = set()
    if isinstance(node, dict):
        if node.get("type") == "function_expression":
            names.add(str(node.get("value")))
        for child in node.get("children", []):
            names |= _function_names(child)
    return names


class Source(StrEnum):
    NAME = "name"  # a path parameter, else one of BUILTINS
    QUERY = "query"
    HEADER = "header"
    BODY = "body"


class Encoding(StrEnum):
    TEXT = "text"  # keys and headers: values as they are
    PATH = "path"  # a URL path: text values are percent-encoded, '/' kept
    QUERY = "query"  # a query string: every value percent-encoded, '/' too


@dataclass(frozen=True, slots=True)
class Placeholder:
    text: str  # as written between the braces
    source: Source
    name: str  # parameter, query or (lower-case) header name; the expression for BODY
    expression: Expression | None = None

    @classmethod
    def parse(cls, text: str) -> Placeholder:
        head, dot, rest = text.partition(".")
        if text == "body" or (head == "body" and dot):
            return cls(text, Source.BODY, rest or "@", Expression.compile(rest or "@"))
        if head == "query" and dot and rest:
            return cls(text, Source.QUERY, rest)
        if head == "header" and dot and _TOKEN.fullmatch(rest):
            return cls(text, Source.HEADER, rest.lower())
        if PARAM_NAME.fullmatch(text):
            return cls(text, Source.NAME, text)
        raise TemplateSyntaxError(
            f"unknown placeholder {{{text}}}: expected {{PARAM}}, {{query.NAME}}, "
            "{header.NAME}, {body.EXPR}, {method}, {host} or {path}"
        )

    def value(self, facts: HttpRequestFacts, params: Mapping[str, str]) -> tuple[str, bool]:
        """The value as text, and whether that text is already in URL form."""
        if self.source is Source.NAME:
            if self.name in params:
                return params[self.name], True
            if self.name in BUILTINS:
                return str(getattr(facts, self.name)), self.name == "path"
            raise TemplateValueMissing(self.text, "no such path parameter")
        found: Any
        if self.source is Source.QUERY:
            found = facts.query.get(self.name)
        elif self.source is Source.HEADER:
            found = facts.headers.get(self.name)
        else:
            data = facts.json_body()
            if data is None:
                raise TemplateValueMissing(self.text, "the request body is not JSON")
            try:
                found = self.expression.search(data) if self.expression else None
            except JMESPathError as error:
                raise TemplateValueMissing(self.text, str(error).splitlines()[0]) from None
        if found is None:
            raise TemplateValueMissing(self.text, "the request has no such value")
        if isinstance(found, str):
            return found, False
        return json.dumps(found, separators=(",", ":"), sort_keys=True, ensure_ascii=False), False


@dataclass(frozen=True, slots=True)
class Template:
    """Literal text and ``{placeholders}``; ``{{`` and ``}}`` are literal braces.

    ``{NAME}`` is the path parameter NAME, else ``{method}``, ``{host}`` or ``{path}`` (a
    path parameter of that name wins); ``{query.NAME}``, ``{header.NAME}`` and
    ``{body.EXPR}`` (JMESPath over the JSON body; ``{body}`` is all of it) read the
    request. Strings render as they are, other values as compact JSON.
    """

    source: str
    parts: tuple[str | Placeholder, ...]

    @classmethod
    def parse(cls, source: str) -> Template:
        parts: list[str | Placeholder] = []
        literal: list[str] = []
        i = 0
        while i < len(source):
            char = source[i]
            if char in "{}" and source.startswith(char * 2, i):
                literal.append(char)
                i += 2
            elif char == "}":
                raise TemplateSyntaxError(
                    f"unmatched '}}' at column {i + 1} of {source!r} (write '}}}}' for a brace)"
                )
            elif char == "{":
                end = _closing(source, i)
                if end == i + 1:
                    raise TemplateSyntaxError(f"empty placeholder '{{}}' in {source!r}")
                if literal:
                    parts.append("".join(literal))
                    literal = []
                parts.append(Placeholder.parse(source[i + 1 : end]))
                i = end + 1
            else:
                literal.append(char)
                i += 1
        if literal:
            parts.append("".join(literal))
        return cls(source, tuple(parts))

    @property
    def placeholders(self) -> tuple[Placeholder, ...]:
        return tuple(p for p in self.parts if isinstance(p, Placeholder))

    def render(
        self,
        facts: HttpRequestFacts,
        params: Mapping[str, str],
        encoding: Encoding = Encoding.TEXT,
    ) -> str:
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            text, url_form = part.value(facts, params)
            if encoding is Encoding.PATH and not url_form:
                text = quote(text, safe="/")
            elif encoding is Encoding.QUERY:
                text = quote(unquote(text) if url_form else text, safe="")
            out.append(text)
        return "".join(out)


def _closing(source: str, start: int) -> int:
    """Index of the brace closing the one at ``start``, skipping JMESPath quotes and braces."""
    depth, quote_char, i = 0, "", start
    while i < len(source):
        char = source[i]
        if quote_char:
            if char == "\\":
                i += 1
            elif char == quote_char:
                quote_char = ""
        elif char in "'\"`":
            quote_char = char
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise TemplateSyntaxError(f"unclosed '{{' at column {start + 1} of {source!r}")


@dataclass(frozen=True, slots=True)
class UrlTemplate:
    """A probe's ``/path?query``: values are percent-encoded for the part they land in."""

    source: str
    path: Template
    query: Template | None

    @classmethod
    def parse(cls, source: str) -> UrlTemplate:
        if not source.startswith("/"):
            raise TemplateSyntaxError(f"invalid probe path {source!r}: it must start with '/'")
        if "#" in source:  # the target is sent as written: a fragment would go with it
            raise TemplateSyntaxError(
                f"invalid probe path {source!r}: a request has no '#fragment'"
            )
        whole = Template.parse(source)
        path: list[str | Placeholder] = []
        query: list[str | Placeholder] | None = None
        for part in whole.parts:
            if query is not None:
                query.append(part)
            elif isinstance(part, str) and "?" in part:
                before, _, after = part.partition("?")
                path.append(before)
                query = [after] if after else []
            else:
                path.append(part)
        return cls(
            source,
            Template(source, tuple(path)),
            None if query is None else Template(source, tuple(query)),
        )

    @property
    def placeholders(self) -> tuple[Placeholder, ...]:
        return self.path.placeholders + (self.query.placeholders if self.query else ())

    def render(self, facts: HttpRequestFacts, params: Mapping[str, str]) -> str:
        path = self.path.render(facts, params, Encoding.PATH)
        if self.query is None:
            return path
        return f"{path}?{self.query.render(facts, params, Encoding.QUERY)}"
