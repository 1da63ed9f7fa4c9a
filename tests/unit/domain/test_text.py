"""What the store can hold: text scrubbed of what UTF-8 cannot encode."""

from __future__ import annotations

import json

from sidecar.domain.text import REPLACEMENT, scrubbed


def test_lone_surrogates_are_replaced_at_any_depth_and_ascii_is_kept_as_it_is():
    value = {
        "plain": "ascii only, NUL\x00 too",
        "bad\udcff": ["x\ud800y", {"k": "caf\u00e9 \ud83d"}],
        "n": 3,
        "ok": "caf\u00e9 \U0001f600",
    }
    assert scrubbed(value) == {
        "plain": "ascii only, NUL\x00 too",
        f"bad{REPLACEMENT}": [f"x{REPLACEMENT}y", {"k": f"caf\u00e9 {REPLACEMENT}"}],
        "n": 3,
        "ok": "caf\u00e9 \U0001f600",
    }
    # Every string now encodes (a lone surrogate would raise UnicodeEncodeError here).
    json.dumps(scrubbed(value), ensure_ascii=False).encode("utf-8")
