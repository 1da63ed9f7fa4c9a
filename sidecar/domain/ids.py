"""Task and attempt identities, and the idempotency keys derived from them."""

from __future__ import annotations

import hashlib
import secrets

# What a task id may be, everywhere (paths, flags, settings): a letter or digit, then up
# to 127 of letters, digits and ._:@- (no '/', no whitespace, no control character).
TASK_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"


def new_attempt_id() -> str:
    """A fresh attempt id, ``att-`` + 64 random bits (unique across all tasks)."""
    return "att-" + secrets.token_hex(8)


def idempotency_key(attempt_id: str, effect_key: str) -> str:
    """The idempotency key sent upstream for an effect, stable for its whole life.

    Minted once, by the attempt that first issues the effect, and reused by every later
    retry of that effect, so an API that dedupes on it sees one request (SPEC §3).
    """
    digest = hashlib.sha256(effect_key.encode()).hexdigest()[:16]
    return f"{attempt_id}:{digest}"
