"""The walk-throughs of README.md and docs/, run verbatim against real `sidecar serve`
processes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from urllib.parse import urlsplit

import psycopg
import pytest

from sidecar.cli import main
from tests.acceptance.conftest import REPO

pytestmark = pytest.mark.acceptance


def docs_text() -> str:
    """README.md and every docs/*.md, one after the other: where the blocks live."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return "\n".join(path.read_text() for path in paths)


def _block(name: str) -> str:
    found = re.findall(
        rf"<!-- {name}:start -->\s*```bash\n(.*?)```\s*<!-- {name}:end -->",
        docs_text(),
        re.DOTALL,
    )
    assert len(found) == 1, f"README.md and docs/ hold {len(found)} {name} blocks, not one"
    return found[0]


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


def _free_port_run(count: int = 2) -> int:
    """A port P with P .. P+count-1 all free (the blocks use PORT, PORT+1, ...)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return port
    raise AssertionError(f"no {count} consecutive free ports")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_readme_agent_walkthrough_replays_the_charge_after_a_sigkill(tmp_path):
    block = _block("agent-walkthrough")
    env = os.environ | {
        "PORT": str(_free_port_run(2)),
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
    rules = (REPO / "docs" / "rules.md").read_text()
    example = re.search(r"## Rules.*?```yaml\n(.*?)```", rules, re.DOTALL)
    assert example, "docs/rules.md lost its rule example"
    path = tmp_path / "example.yaml"
    path.write_text(example.group(1))
    assert main(["rules", "check", str(path)]) == 0


def test_the_readme_postgres_walkthrough_changes_the_schema_once(tmp_path, postgres_server):
    server = urlsplit(postgres_server)
    env = os.environ | {
        "PORT": str(_free_port_run(3)),
        "SERVER": f"{server.hostname}:{server.port or 5432}",
        "DATA": str(tmp_path / "pg-demo"),
    }
    done = subprocess.run(
        ["bash", "-uo", "pipefail", "-c", _block("pg-walkthrough")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS shop_312 WITH (FORCE)")  # the block's database
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    assert out.count("ALTER TABLE\nCREATE INDEX\nINSERT 0 3\n") == 2  # both attempts, exit 0
    assert "status columns: 1\nseed rows: 3" in out
    trail = out[out.index("audit trail") :]
    for key in re.findall(r"^(sql:\w+|seed-order-statuses) +completed", out, re.MULTILINE):
        assert re.search(rf"{key} +pending +att-\w+ +1 ", trail)
        assert re.search(rf"{key} +completed +att-\w+ +1 ", trail)
        assert re.search(rf"{key} +replayed +att-\w+ +2 ", trail)
    assert len(re.findall(r" replayed +att-", trail)) == 3
