"""The counting upstream as the matrix tests' outside world, and running the command."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.testing.processes import Child

HERE = Path(__file__).parent
AGENTS = HERE / "agents"


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    """A counting upstream (sidecar.testing.upstream) of its own; yields its URL."""
    with Child.python("sidecar.testing.upstream", stderr_path=tmp_path / "upstream.log") as child:
        yield child.wait_for(r"upstream ready (\S+)").group(1)


def matrix(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``sidecar matrix ARGS`` as a user runs it, to completion."""
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "matrix", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def shop_matrix(
    out: Path, upstream: str, rules: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """The shop agent's matrix: its rules, api.shop.test routed to ``upstream``, and the
    check that counts charges, invoices and receipts there."""
    return matrix(
        "--rules", str(HERE / rules),
        "--route", f"api.shop.test={upstream}",
        "--check", f"{sys.executable} {AGENTS / 'shop_check.py'} {upstream}",
        "--out", str(out),
        *extra,
        "--", sys.executable, str(AGENTS / "shop_agent.py"),
    )  # fmt: skip


def cells(out: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads((out / "matrix.json").read_text())["cells"]
    return found
