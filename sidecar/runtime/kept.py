"""Answers kept for inputs that come again and again: a dictionary with a bound.

The proxy and the relay keep what they worked out for a Host header, a Proxy-Authorization
value, a host's rules and an SQL text, since agents send the same few again and again.
Each store is bounded in number (and each caller bounds the length of what it keeps):
once full it is emptied, so a flood of made-up inputs only starts the memory again and
never grows it, with no bookkeeping per hit.
"""

from __future__ import annotations


def keep[K, V](kept: dict[K, V], key: K, value: V, limit: int) -> None:
    """Keep ``value`` for ``key`` in ``kept``, which holds at most ``limit`` entries:
    when it is full, it is emptied first."""
    if len(kept) >= limit:
        kept.clear()
    kept[key] = value
