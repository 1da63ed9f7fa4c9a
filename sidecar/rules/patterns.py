"""What a rule's ``match`` section is made of: host patterns and path templates.

Both are parsed once when the rules are loaded; matching a request is then a regular
expression or two per condition, in linear time: host globs on the linear-time engine
(``sidecar.rules.regex``; their answers are kept per host), path templates on ``re``,
which runs the patterns they make in linear time too (:meth:`PathTemplate.parse` says
why) and some 8x faster than RE2's Python binding: path templates are matched on every
request to a host with rules, several per request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.rules.regex import LinearPattern, compile_pattern, escape
from sidecar.rules.templates import PARAM_NAME, TemplateSyntaxError

_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.*]+)\]|(?P<name>[a-z0-9*?._-]+))(?::(?P<port>\d{1,5}))?")


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A case-insensitive glob over the host name, optionally pinned to one port."""

    source: str
    regex: LinearPattern
    port: int | None

    @classmethod
    def parse(cls, source: str) -> HostPattern:
        found = _HOST.fullmatch(source.strip().lower())
        if found is None:
            raise TemplateSyntaxError(
                f"invalid host pattern {source!r}: expected a host name, a glob such as "
                "'*.example.com', optionally with ':PORT'"
            )
        port = int(found["port"]) if found["port"] else None
        if port is not None and not 0 < port < 65536:
            raise TemplateSyntaxError(f"invalid host pattern {source!r}: port out of range")
        host = found["v6"] or found["name"]
        return cls(source, compile_pattern(_glob(host)), port)

    def matches(self, host: str, port: int | None = None) -> bool:
        """Whether ``host`` (lower-case, no brackets) matches; an unknown port matches any."""
        if self.port is not None and port is not None and port != self.port:
            return False
        return self.regex.fullmatch(host) is not None


def _glob(host: str) -> str:
    """A host glob as a pattern: ``*`` any run of characters (dots too), ``?`` one."""
    wild = {"*": ".*", "?": "."}
    return "".join(wild.get(char) or escape(char) for char in host)


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """``{name}`` takes one non-empty segment, ``{name*}`` one or more; literals match exactly.

    A ``{name}`` may have literal text around it within its segment (``/bot{token}``,
    ``/{id}.json``), one parameter per segment; a ``{name*}`` is a whole segment.  It
    matches the request path as sent (percent-encoded, without the query), so the
    parameters it captures are in URL form. A trailing slash on the request is tolerated.
    """

    source: str
    params: tuple[str, ...]
    #: the whole template, if it has no ``{name*}``; else the segments before it
    regex: re.Pattern[str]
    #: a template with a ``{name*}``: the segments after it, and how many on each side
    starred: _Starred | None = None

    @classmethod
    def parse(cls, source: str) -> PathTemplate:
        """The template compiled, or :class:`TemplateSyntaxError` saying what is wrong.

        It compiles with ``re``: each ``{name}`` is ``[^/]+``, which cannot cross a '/',
        so each segment can end only where the template's own '/' (or the end) is, and
        the literal text after a parameter must end there too: every segment matches at
        most one way, and a backtracking engine retries at most each segment's length
        once - linear, whatever the path.  A ``{name*}`` (one or more whole segments) has
        no such bound in one pattern, so the segments before it and after it are
        matched apart, each side by the segments it must take (:meth:`_match_starred`):
        what is left between them is the ``{name*}``."""

        def bad(why: str) -> TemplateSyntaxError:
            return TemplateSyntaxError(f"invalid path template {source!r}: {why}")

        if not source.startswith("/"):
            raise bad("it must start with '/'")
        if "?" in source or "#" in source:
            raise bad("no query or fragment here (conditions on the query go in match.query)")
        params: list[str] = []
        pieces: list[str] = []
        stars = 0
        star_at = -1
        body = source.rstrip("/")
        for segment in body.split("/")[1:] if body else []:
            if not segment:
                raise bad("empty segment ('//')")
            found = _SEGMENT.fullmatch(segment)
            if found is None:
                if "{" in segment or "}" in segment:
                    raise bad(f"{segment!r}: at most one {{name}} per segment, braces balanced")
                pieces.append(re.escape(segment))
                continue
            name, star = found["name"].removesuffix("*"), found["name"].endswith("*")
            if not PARAM_NAME.fullmatch(name):
                raise bad(f"{segment!r} is not a parameter name (letters, digits, '_')")
            if name in params:
                raise bad(f"parameter {{{name}}} appears twice")
            if star and (found["before"] or found["after"]):
                raise bad(f"a {{{name}*}} parameter must be a whole segment, not {segment!r}")
            stars += star
            if stars > 1:
                raise bad("only one {name*} parameter is allowed")
            params.append(name)
            if star:
                star_at = len(pieces)
                pieces.append("")
                continue
            capture = f"(?P<{name}>[^/]+)"
            pieces.append(re.escape(found["before"]) + capture + re.escape(found["after"]))
        if star_at < 0:
            pattern = "/" + "/".join(pieces) + ("/?" if pieces else "")
            return cls(source, tuple(params), re.compile(pattern))
        before, after = pieces[:star_at], pieces[star_at + 1 :]
        starred = _Starred(re.compile("/".join(after)), len(before), len(after))
        return cls(source, tuple(params), re.compile("/".join(before)), starred)

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters, in URL form, if ``path`` is one the template describes."""
        if self.starred is not None:
            return self._match_starred(path, self.starred)
        found = self.regex.fullmatch(path)
        if found is None:
            return None
        # The pattern's groups are the parameters, one each, in order (parse() makes no
        # other group), so they are read by position.
        return dict(zip(self.params, found.groups(), strict=True))

    def _match_starred(self, path: str, starred: _Starred) -> dict[str, str] | None:
        """Match a template with a ``{name*}``: the segments before it and after it take
        the path's first and last segments (neither can take a '/', so which ones is
        fixed), the ``{name*}`` what is between, which must not be empty (nor hold a line
        break: it is ``.+?`` in the template's one-pattern form).  A trailing slash on
        the path is left out first (the ``{name*}`` is then the shortest it can be, as
        that form's lazy ``.+?`` takes it), kept in it otherwise."""
        for text in (path[:-1], path) if path.endswith("/") else (path,):
            if not text.startswith("/"):
                continue
            segments = text[1:].split("/")
            if len(segments) <= starred.before + starred.after:
                continue
            end = len(segments) - starred.after
            star = "/".join(segments[starred.before : end])
            if not star or "\n" in star:
                continue
            head = self.regex.fullmatch("/".join(segments[: starred.before]))
            tail = starred.after_regex.fullmatch("/".join(segments[end:]))
            if head is None or tail is None:
                continue
            values = (*head.groups(), star, *tail.groups())
            return dict(zip(self.params, values, strict=True))
        return None


@dataclass(frozen=True, slots=True)
class _Starred:
    """The shape of a template around its ``{name*}``: the pattern of the segments after
    it, and how many segments come before it and after it."""

    after_regex: re.Pattern[str]
    before: int
    after: int


# One segment holding a parameter, with the literal text around it.
_SEGMENT = re.compile(r"(?P<before>[^{}]*)\{(?P<name>[^{}]*)\}(?P<after>[^{}]*)")
