"""The README's walk-through, run verbatim against a real `sidecar serve` process."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.acceptance.conftest import REPO

pytestmark = pytest.mark.acceptance


def walkthrough_block() -> str:
    readme = (REPO / "README.md").read_text()
    section = re.search(
        r"<!-- walkthrough:start -->\s*```bash\n(.*?)```\s*<!-- walkthrough:end -->",
        readme,
        re.DOTALL,
    )
    assert section, "the README lost its walk-through block"
    return section.group(1)


def test_the_readme_walkthrough_shows_lease_held_then_stale_generation(sidecar_process):
    _, url, data = sidecar_process
    env = os.environ | {"API": url, "DATA": str(data)}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", walkthrough_block()],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    assert '"generation":1' in done.stderr
    assert '"generation":2' in done.stderr
    assert '"code": "lease_held"' in out
    assert '"code": "stale_generation"' in out
    assert out.count('"stage":"READ_COMPLETE"') == 1  # B's claim answer carried it
    assert '"seq":2,"stage":"PATCH_GENERATED","generation":2' in out

    table = out[out.index("task 312  generation 2") :]
    assert re.search(r"^1 +att-\w+ +worker-a .* expired$", table, re.MULTILINE)
    assert re.search(r"^2 +att-\w+ +worker-b .* current$", table, re.MULTILINE)
    assert re.search(r"^1 +READ_COMPLETE +1 ", table, re.MULTILINE)
    assert re.search(r"^2 +PATCH_GENERATED +2 ", table, re.MULTILINE)
    assert re.search(r"checkpoint +att-\w+ +1 +2 +superseded by generation 2", table)
