"""What of a request may be written to the effect log: nothing secret, in clear.

The log keeps enough to audit an effect (method, URL, header names, a redacted copy of
a JSON body, sizes and hashes) and never Authorization, cookies, API keys or anything
that looks like a token.  Recorded *responses* are kept whole (they are replayed to the
agent), except ``Set-Cookie``, which is dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode

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
        secret = lower in _SECRET_HEADERS or bool(_SECRET_NAME.search(lower))
        out[lower] = REDACTED if secret else redact_text(value)
    return out


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
) -> dict[str, Any]:
    """The effect log's record of a request: auditable, with secrets removed."""
    url = f"{scheme}://{host}{path}" + (f"?{redact_query(query)}" if query else "")
    summary: dict[str, Any] = {
        "method": method,
        "url": url,
        "headers": header_summary(headers),
        "body_bytes": len(body or b""),
    }
    if body:
        summary["body_sha256"] = hashlib.sha256(body).hexdigest()
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return summary
        text = json.dumps(redact_json(parsed), separators=(",", ":"))
        summary["body"] = (
            json.loads(text) if len(text) <= MAX_BODY_EXCERPT else text[:MAX_BODY_EXCERPT] + "..."
        )
    return summary


def recordable_response_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Response headers worth replaying: no cookies, no per-connection framing."""
    drop = {"set-cookie", "connection", "keep-alive", "transfer-encoding", "content-length"}
    return tuple((n, v) for n, v in headers if n.lower() not in drop)
