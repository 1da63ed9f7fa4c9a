"""A long effect log is read a page at a time from a running sidecar, at a bounded cost.

The store holds 50,000 effects (one recorded through the store, the rest copied from it
in SQL, which is quicker than recording them); the route answers 100 of them with a
cursor, quickly, without the process growing by the log.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.testing.processes import Child
from tests.acceptance.conftest import serving
from tests.acceptance.memory import resident_mib
from tests.support import long_log

pytestmark = pytest.mark.acceptance

EFFECTS = 50_000


@pytest.fixture
def sidecar_with_a_long_log(tmp_path: Path) -> Iterator[tuple[Child, str]]:
    data = tmp_path / "data"
    long_log.seed(data, EFFECTS)
    with serving(data, tmp_path / "sidecar.log") as started:
        yield started


def _get(url: str) -> tuple[dict, int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as response:
        raw = response.read()
    return json.loads(raw), len(raw), time.monotonic() - started


def test_a_50k_effect_log_is_answered_100_at_a_time(sidecar_with_a_long_log):
    child, url = sidecar_with_a_long_log
    before = resident_mib(child.pid)
    page, size, seconds = _get(f"{url}/v1/tasks/312/effects")
    assert [e["key"] for e in page["effects"]] == [long_log.key(n) for n in range(100)]
    assert page["next_cursor"], "there is more"
    assert size < 512 * 1024, f"a page of {size} bytes"
    assert seconds < 2, f"answered in {seconds:.2f} s"

    seen = len(page["effects"])
    for _ in range(20):
        page, _, _ = _get(f"{url}/v1/tasks/312/effects?limit=500&cursor={page['next_cursor']}")
        seen += len(page["effects"])
    assert seen == 100 + 20 * 500
    assert page["effects"][-1]["key"] == long_log.key(seen - 1)
    growth = resident_mib(child.pid) - before
    assert growth < 40, f"the sidecar grew by {growth:.0f} MiB reading {seen} effects"
