"""Traffic no rule concerns streams through: a 50 MB upload is never held in memory."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.acceptance.proxy.conftest import run_agent

pytestmark = pytest.mark.acceptance

MEGABYTES = 50


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_50_mb_unmatched_upload_streams_without_the_sidecar_growing_by_it(stack):
    pid = stack.sidecar.pid
    run_agent(stack, "312", "requests", [{"upload": "https://files.test/upload", "megabytes": 1}])
    before = resident_mib(pid)
    peak = before
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, resident_mib(pid))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        (answer,) = run_agent(
            stack,
            "312",
            "requests",
            [{"upload": "https://files.test/upload", "megabytes": MEGABYTES}],
        )
    finally:
        done.set()
        watcher.join()
    assert answer["status"] == 200
    assert answer["body"] == {"bytes": MEGABYTES << 20}
    assert answer["x-sidecar-effect"] == "passthrough"
    assert peak - before < MEGABYTES / 2, f"grew {peak - before:.1f} MiB (from {before:.1f})"
