"""Real `sidecar serve` processes for acceptance tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sidecar.testing.processes import Child

REPO = Path(__file__).resolve().parents[2]


def run_sidecar(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``sidecar ARGS`` as a user runs it, to completion; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def serving(data: Path, log: Path) -> Iterator[tuple[Child, str]]:
    """`sidecar serve` on ``data`` with free ports; yields (process, control URL)."""
    child = Child.python(
        "sidecar",
        "serve",
        "--data-dir",
        str(data),
        "--control-listen",
        "127.0.0.1:0",
        # a free port: tests on other workers run sidecars of their own at the same time
        "--proxy-listen",
        "127.0.0.1:0",
        stderr_path=log,
    )
    with child:
        url = child.wait_for(r"effect-sidecar ready control=(\S+)", timeout=30).group(1)
        yield child, url


@pytest.fixture
def sidecar_process(tmp_path: Path) -> Iterator[tuple[Child, str, Path]]:
    """A running `sidecar serve` on a free port; yields (process, control URL, data dir)."""
    data = tmp_path / "data"
    with serving(data, tmp_path / "sidecar.log") as (child, url):
        yield child, url, data
