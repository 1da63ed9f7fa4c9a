"""The README's walk-through, run verbatim against a real `sidecar serve` process."""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from sidecar.cli import main
from tests.acceptance.conftest import REPO

pytestmark = pytest.mark.acceptance


def _block(name: str) -> str:
    readme = (REPO / "README.md").read_text()
    section = re.search(
        rf"<!-- {name}:start -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->",
        readme,
        re.DOTALL,
    )
    assert section, f"the README lost its {name} block"
    return section.group(1)


def test_the_readme_walkthrough_shows_lease_held_then_stale_generation(sidecar_process):
    _, url, data = sidecar_process
    env = os.environ | {"API": url, "DATA": str(data)}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _block("walkthrough")],
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


def _free_port_pair() -> int:
    """A port P with P and P+1 both free (the block uses PORT and PORT+1)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_readme_agent_walkthrough_replays_the_charge_after_a_sigkill(tmp_path):
    block = _block("agent-walkthrough")
    env = os.environ | {
        "PORT": str(_free_port_pair()),
        "UPSTREAM": f"127.0.0.1:{_free_port()}",
        "DATA": str(tmp_path / "demo"),
    }
    done = subprocess.run(
        ["bash", "-uo", "pipefail", "-c", block],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    assert "201 recorded ch_1" in out
    assert "201 replayed ch_1" in out
    assert '"requests": {"POST /v1/charges": 1}, "charges": 1' in out
    trail = out[out.index("audit trail") :]
    assert re.search(r"order-312 +pending +att-\w+ +1 ", trail)
    assert re.search(r"order-312 +replayed +att-\w+ +2 ", trail)


def test_the_readme_rule_example_is_a_valid_rule_file(tmp_path):
    readme = (REPO / "README.md").read_text()
    example = re.search(r"## Rules.*?```yaml\n(.*?)```", readme, re.DOTALL)
    assert example, "the README lost its rule example"
    path = tmp_path / "example.yaml"
    path.write_text(example.group(1))
    assert main(["rules", "check", str(path)]) == 0
