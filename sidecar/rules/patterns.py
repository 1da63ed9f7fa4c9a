"""What a rule's ``match`` section is made of: host patterns and path templates.

Both are parsed once when the rules are loaded; matching a request is then one regular
expression per condition, in linear time: host globs and ``{name*}`` templates on the
linear-time engine (``sidecar.rules.regex``), every other path template on ``re``, which
runs the patterns they make in linear time too (:meth:`PathTemplate.parse` says why) and
some 8x faster through RE2's Python binding: path templates are matched on every request
to a host with rules, several per request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.rules.regex import LinearPattern, compile_pattern
from sidecar.rules.regex import escape as linear_escape
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
    return "".join(wild.get(char) or linear_escape(char) for char in host)


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
    regex: LinearPattern | re.Pattern[str]

    @classmethod
    def parse(cls, source: str) -> PathTemplate:
        """The template compiled, or :class:`TemplateSyntaxError` saying what is wrong.

        Without a ``{name*}``, it compiles with ``re``: each ``{name}`` is ``[^/]+``,
        which cannot cross a '/', so each segment can end only where the template's own
        '/' (or the end) is, and the literal text after a parameter must end there too:
        every segment matches at most one way, and a backtracking engine retries at most
        each segment's length once - linear, whatever the path.  A ``{name*}`` (any
        number of segments, then more template) has no such bound, so RE2 runs it."""

        def bad(why: str) -> TemplateSyntaxError:
            return TemplateSyntaxError(f"invalid path template {source!r}: {why}")

        if not source.startswith("/"):
            raise bad("it must start with '/'")
        if "?" in source or "#" in source:
            raise bad("no query or fragment here (conditions on the query go in match.query)")
        params: list[str] = []
        pieces: list[str] = []
        stars = 0
        # A '*}' in a valid template is a {name*}; in any other, an error comes below.
        escape = linear_escape if "*}" in source else re.escape
        body = source.rstrip("/")
        for segment in body.split("/")[1:] if body else []:
            if not segment:
                raise bad("empty segment ('//')")
            found = _SEGMENT.fullmatch(segment)
            if found is None:
                if "{" in segment or "}" in segment:
                    raise bad(f"{segment!r}: at most one {{name}} per segment, braces balanced")
                pieces.append(escape(segment))
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
            capture = f"(?P<{name}>{'.+?' if star else '[^/]+'})"
            pieces.append(escape(found["before"]) + capture + escape(found["after"]))
        pattern = "/" + "/".join(pieces) + ("/?" if pieces else "")
        regex = compile_pattern(pattern) if stars else re.compile(pattern)
        return cls(source, tuple(params), regex)

    def match(self, path: str) -> dict[str, str] | None:
        found = self.regex.fullmatch(path)
        if found is None:
            return None
        # The pattern's groups are the parameters, one each, in order (parse() makes no
        # other group), so they are read by position: by name costs RE2 far more.
        # (``re`` never leaves one of them out; RE2's lazy ``{name*}`` neither.)
        return {
            name: value
            for name, value in zip(self.params, found.groups(), strict=True)
            if value is not None
        }


# One segment holding a parameter, with the literal text around it.
_SEGMENT = re.compile(r"(?P<before>[^{}]*)\{(?P<name>[^{}]*)\}(?P<after>[^{}]*)")
