"""How much a real process's resident memory grows while something happens."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def peak_growth[T](pid: int, action: Callable[[], T]) -> tuple[float, T]:
    """Run ``action``; return how far process ``pid``'s RSS rose above where it started
    (sampled every 10 ms meanwhile), and what ``action`` returned."""
    before = peak = resident_mib(pid)
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, resident_mib(pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = action()
    finally:
        done.set()
        watcher.join()
    return peak - before, result
