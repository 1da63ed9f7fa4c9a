"""A bounded store of answers: it never holds more than its limit."""

from __future__ import annotations

from sidecar.runtime.kept import keep


def test_what_is_kept_is_found_again_until_the_store_fills_and_starts_again() -> None:
    kept: dict[str, int] = {}
    for n in range(3):
        keep(kept, f"k{n}", n, limit=3)
    assert kept == {"k0": 0, "k1": 1, "k2": 2}
    keep(kept, "k1", 10, limit=3)  # full: emptied first, then kept
    assert kept == {"k1": 10}
    for n in range(100):
        keep(kept, f"flood{n}", n, limit=3)
        assert len(kept) <= 3
