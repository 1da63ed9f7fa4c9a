"""Real `sidecar serve` processes for acceptance tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.testing.processes import Child

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sidecar_process(tmp_path: Path) -> Iterator[tuple[Child, str, Path]]:
    """A running `sidecar serve` on a free port; yields (process, control URL, data dir)."""
    data = tmp_path / "data"
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
        stderr_path=tmp_path / "sidecar.log",
    )
    with child:
        url = child.wait_for(r"effect-sidecar ready control=(\S+)", timeout=30).group(1)
        yield child, url, data
