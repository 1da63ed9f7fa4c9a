"""Traffic no rule concerns streams through: a 50 MB upload is never held in memory."""

from __future__ import annotations

import pytest

from tests.acceptance.memory import peak_growth
from tests.acceptance.proxy.conftest import run_agent

pytestmark = pytest.mark.acceptance

MEGABYTES = 50


def test_a_50_mb_unmatched_upload_streams_without_the_sidecar_growing_by_it(stack):
    pid = stack.sidecar.pid
    run_agent(stack, "312", "requests", [{"upload": "https://files.test/upload", "megabytes": 1}])
    upload = [{"upload": "https://files.test/upload", "megabytes": MEGABYTES}]
    growth, (answer,) = peak_growth(pid, lambda: run_agent(stack, "312", "requests", upload))
    assert answer["status"] == 200
    assert answer["body"] == {"bytes": MEGABYTES << 20}
    assert answer["x-sidecar-effect"] == "passthrough"
    assert growth < MEGABYTES / 2, f"grew {growth:.1f} MiB"
