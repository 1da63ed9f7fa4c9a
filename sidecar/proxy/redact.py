"""What of an effect may be written to the effect log and the logs: nothing secret, in clear.

The log keeps enough to audit an effect (method, URL, header names, a redacted copy of
a JSON body, sizes and hashes) and never Authorization, cookies, API keys, anything
that looks like a token, or the path parameters a rule marks secret (``redact.params``).
Recorded *responses* are kept whole, as they are replayed to the agent, except
``Set-Cookie``, which is dropped, and the fields a rule names (``redact.response``):
those are stored redacted, so a replay answers with the redacted value.  Responses are
not redacted by name by default: a ``token`` in a create-token API's answer is what the
agent asked for.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlencode

from mitmproxy.net import encoding

from sidecar.domain.model import RecordedResponse

REDACTED = "[redacted]"
MAX_BODY_EXCERPT = 4096

_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
        "x-github-token",
        "private-token",
        "x-amz-security-token",
    }
)
# Names that say "secret", for headers, query parameters and JSON fields alike - a
# pattern, not a list of known names (Ocp-Apim-Subscription-Key, X-Functions-Key, pwd,
# private_key, an Azure SAS "sig", a card number and its cvc).  Redacting a harmless field
# by mistake costs an audit detail; missing a secret leaves it at rest in clear.
_SECRET_NAME = re.compile(
    r"(secret|token|passw|pwd|passphrase|api[-_]?key|(^|[-_.])key$|auth|credential"
    r"|signature|^sig$|session|cookie|private|card|cvc|cvv)",
    re.IGNORECASE,
)
# Shapes of common credentials: GitHub (ghp_, gho_, github_pat_), Slack (xox?-), Stripe
# (sk_/rk_ live/test), OpenAI/Anthropic (sk-...), AWS access keys, JWTs, long hex/base64.
_SECRET_VALUE = re.compile(
    r"(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|xox[abposr]-[\w-]{10,}"
    r"|[sr]k_(live|test)_\w{10,}|sk-[\w-]{20,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[\w-]{10,}\.[\w-]{10,}\.[\w-]{10,}|[A-Fa-f0-9]{40,}|[A-Za-z0-9+/=_-]{48,})"
)


def header_summary(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        out[lower] = REDACTED if _secret_header(lower) else redact_text(value)
    return out


# Remembered per name: an agent sends the same few header names on every request, and
# the pattern search over each was most of a summary's cost (~11 of 14 us for 8 fields).
# A name is at most what mitmproxy lets into a request head, so 512 of them stay small.
@functools.lru_cache(maxsize=512)
def _secret_header(lower: str) -> bool:
    return lower in _SECRET_HEADERS or _SECRET_NAME.search(lower) is not None


def redact_text(value: str) -> str:
    return _SECRET_VALUE.sub(REDACTED, value)


def redact_query(query: str) -> str:
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode(
        [(k, REDACTED if _SECRET_NAME.search(k) else redact_text(v)) for k, v in pairs]
    )


def redact_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            str(k): REDACTED if _SECRET_NAME.search(str(k)) else redact_json(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_json(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def request_summary(
    method: str,
    scheme: str,
    host: str,
    path: str,
    query: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
    parsed: Any = None,
    body_sha256: str | None = None,
) -> dict[str, Any]:
    """The effect log's record of a request: auditable, with secrets removed.

    ``parsed`` is the body already parsed as JSON, and ``body_sha256`` its digest, when
    the caller has them (None: made here).  Only the excerpt kept is redacted and
    encoded, however large the body: a 1 MiB body costs its hash and its parse, not a
    walk over every value on the loop."""
    url = f"{scheme}://{host}{path}" + (f"?{redact_query(query)}" if query else "")
    summary: dict[str, Any] = {
        "method": method,
        "url": url,
        "headers": header_summary(headers),
        "body_bytes": len(body or b""),
    }
    if body:
        summary["body_sha256"] = body_sha256 or hashlib.sha256(body).hexdigest()
        if parsed is None:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError, RecursionError):
                return summary
        text = excerpt(parsed, MAX_BODY_EXCERPT + 1)
        summary["body"] = (
            json.loads(text) if len(text) <= MAX_BODY_EXCERPT else text[:MAX_BODY_EXCERPT] + "..."
        )
    return summary


def excerpt(value: Any, limit: int) -> str:
    """The first ``limit`` characters (at least) of ``redact_json(value)`` as compact JSON,
    all of it if shorter - encoded only as far as needed."""
    chunks: list[str] = []
    size = 0
    for chunk in _redacted_chunks(value, limit):
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return "".join(chunks)


# A run of characters a credential is made of, at the end of a cut string: what is left
# of a secret the cut may have split, too short for _SECRET_VALUE to know it.
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9+/=_.-]+$")


def _redacted_chunks(value: Any, limit: int) -> Iterator[str]:
    if isinstance(value, Mapping):
        yield "{"
        for at, (name, item) in enumerate(value.items()):
            yield ("," if at else "") + json.dumps(str(name)) + ":"
            if _SECRET_NAME.search(str(name)):
                yield json.dumps(REDACTED)
            else:
                yield from _redacted_chunks(item, limit)
        yield "}"
    elif isinstance(value, list):
        yield "["
        for at, item in enumerate(value):
            if at:
                yield ","
            yield from _redacted_chunks(item, limit)
        yield "]"
    elif isinstance(value, str):
        if len(value) <= limit:
            yield json.dumps(redact_text(value))
        else:  # only the head can be shown: redact it, less a token the cut split
            head = redact_text(value[: limit + 256])
            yield json.dumps(_TOKEN_TAIL.sub("", head))
    else:
        yield json.dumps(value)


def recordable_response_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Response headers worth replaying: no cookies, no per-connection framing."""
    drop = {"set-cookie", "connection", "keep-alive", "transfer-encoding", "content-length"}
    return tuple((n, v) for n, v in headers if n.lower() not in drop)


def without_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret, as sent or percent-decoded, redacted.

    For anything shown about a request whose URL carries a secret (a bot token, a webhook
    secret): its stored URL, log lines, error details that quote the URL.
    """
    if not secrets:  # most rules mark none: this runs for every request they match
        return text
    forms = {form for secret in secrets if secret for form in (secret, unquote(secret))}
    for form in sorted(forms, key=len, reverse=True):  # a secret inside another: longest first
        text = text.replace(form, REDACTED)
    return text


# What a response whose secrets cannot be found (it is neither JSON nor a form) keeps of
# its body: nothing.  The header tells whoever gets the replay why the body is empty.
UNREADABLE_BODY_HEADER = ("X-Sidecar-Redacted", "body not kept: secret fields not readable")


def redact_response(
    response: RecordedResponse, fields: Sequence[tuple[str, ...]]
) -> RecordedResponse:
    """The answer as the effect log keeps it when a rule names secret fields in it.

    The body is decoded (``Content-Encoding``) and each field - a path of names from the
    top of the JSON, lists on the way stepped into, or a top-level name of a form-encoded
    body - is replaced by ``[redacted]``.  A body where nothing was found is kept as it came,
    byte for byte; a body that cannot be read is not kept at all.
    """
    if not fields or not response.body:
        return response
    text = _decoded(response)
    redacted = None if text is None else _redacted_json(text, fields)
    if redacted is None and text is not None and _is_form(response):
        redacted = _redacted_form(text, fields)
    if redacted is None:
        headers = (*_without_encoding(response.headers), UNREADABLE_BODY_HEADER)
        return RecordedResponse(response.status, headers, b"")
    if redacted is text:
        return response
    return RecordedResponse(response.status, _without_encoding(response.headers), redacted)


def _header(headers: Iterable[tuple[str, str]], name: str) -> str:
    return next((v for n, v in headers if n.lower() == name), "")


def _without_encoding(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple((n, v) for n, v in headers if n.lower() != "content-encoding")


def _decoded(response: RecordedResponse) -> bytes | None:
    """The body with its content codings undone (last applied, first undone)."""
    body = response.body
    codings = [c.strip().lower() for c in _header(response.headers, "content-encoding").split(",")]
    try:
        for coding in reversed([c for c in codings if c]):
            body = cast(bytes, encoding.decode(body, coding))
    except ValueError:  # an unknown coding, or a body that is not what it says
        return None
    return body


def _is_form(response: RecordedResponse) -> bool:
    content_type = _header(response.headers, "content-type")
    return content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"


def _redacted_json(body: bytes, fields: Sequence[tuple[str, ...]]) -> bytes | None:
    """The JSON with the fields redacted; ``body`` itself if none is there; None if not JSON."""
    try:
        data = json.loads(body)
        found = [_redact_at(data, path) for path in fields]
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or absurdly deep
        return None
    if not any(found):
        return body
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _redact_at(data: Any, path: tuple[str, ...]) -> bool:
    """Redact ``path`` in ``data`` (in place); whether it was there."""
    if isinstance(data, list):
        return any([_redact_at(item, path) for item in data])  # every item, no short cut
    if not isinstance(data, dict) or path[0] not in data:
        return False
    if len(path) == 1:
        data[path[0]] = REDACTED
        return True
    return _redact_at(data[path[0]], path[1:])


def _redacted_form(body: bytes, fields: Sequence[tuple[str, ...]]) -> bytes | None:
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=True)
    except (ValueError, UnicodeDecodeError):
        return None
    names = {path[0] for path in fields if len(path) == 1}
    if not any(name in names for name, _ in pairs):
        return body
    return urlencode([(n, REDACTED if n in names else v) for n, v in pairs]).encode()


#: Bodies from this size on are hashed on a worker thread: hashlib lets go of the GIL
#: while it hashes, so the event loop goes on meanwhile, with other flows and with this
#: one's fingerprint (~0.6 ms per MiB of sha256 off the loop, for ~0.1 ms of hand-off).
OFF_LOOP_BYTES = 256 * 1024


def body_digest_off_loop(body: bytes) -> asyncio.Future[str] | None:
    """The sha256 of a large ``body``, being computed on a worker thread (the loop's
    default executor: a future, not a task, so one nobody awaits leaves nothing behind);
    None for a body small enough to hash where it is needed."""
    if len(body) < OFF_LOOP_BYTES:
        return None
    return asyncio.get_running_loop().run_in_executor(None, _sha256_hex, body)


def _sha256_hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
