"""The walk-throughs of README.md and docs/, run verbatim against real `sidecar serve`
processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess
from urllib.parse import urlsplit

import psycopg
import pytest

from sidecar.cli import main
from tests.acceptance.conftest import REPO
from tests.support.ports import free_port, free_ports

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


BLOCK_TIMEOUT_S = 90  # under pytest's own 120 s, so that a hang reports what it saw


def _run_block(name: str, env: dict[str, str], *, flags: str = "-uo") -> CompletedProcess[str]:
    """Runs a docs block the way a reader pastes it into bash. A block still running after
    BLOCK_TIMEOUT_S fails the test with what it printed and the sidecar's log ($DATA), and
    leaves none of its processes behind (the sidecar it started in the background too)."""
    child = subprocess.Popen(
        ["bash", flags, "pipefail", "-c", _block(name)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        log = Path(env["DATA"]) / "sidecar.log"
        seen = log.read_text()[-4000:] if log.exists() else "(none)"
        raise AssertionError(
            f"the {name} block still ran after {BLOCK_TIMEOUT_S} s\n--- stdout\n{out}"
            f"\n--- stderr\n{err}\n--- {log}\n{seen}"
        ) from None
    return CompletedProcess(child.args, child.returncode, out, err)


def test_the_readme_walkthrough_shows_lease_held_then_stale_generation(sidecar_process):
    _, url, data = sidecar_process
    env = os.environ | {"API": url, "DATA": str(data)}
    done = _run_block("walkthrough", env, flags="-euo")
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


def test_the_readme_agent_walkthrough_replays_the_charge_after_a_sigkill(tmp_path):
    env = os.environ | {
        "PORT": str(free_ports(2)),
        "UPSTREAM": f"127.0.0.1:{free_port()}",
        "DATA": str(tmp_path / "demo"),
    }
    done = _run_block("agent-walkthrough", env)
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


@pytest.fixture
def shop_312(postgres_server: str) -> Iterator[str]:
    """The real server the PostgreSQL block runs against (host:port); the block's own
    database, shop_312, is dropped after it."""
    server = urlsplit(postgres_server)
    yield f"{server.hostname}:{server.port or 5432}"
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS shop_312 WITH (FORCE)")


def test_the_readme_postgres_walkthrough_changes_the_schema_once(tmp_path, shop_312):
    env = os.environ | {
        "PORT": str(free_ports(3)),
        "SERVER": shop_312,
        "DATA": str(tmp_path / "pg-demo"),
    }
    done = _run_block("pg-walkthrough", env)
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


@pytest.mark.parametrize(("name", "taken"), [("agent-walkthrough", 1), ("pg-walkthrough", 2)])
def test_a_walkthrough_whose_sidecar_cannot_listen_stops_with_the_reason(
    tmp_path, shop_312, name, taken
):
    # A port of the block's is taken (by a reader's other program, or once in CI by
    # another test): the block ends at once with the sidecar's own words, not waiting for
    # a /readyz that never comes.
    port = free_ports(3)
    env = os.environ | {
        "PORT": str(port),
        "UPSTREAM": f"127.0.0.1:{free_port()}",
        "SERVER": shop_312,
        "DATA": str(tmp_path / "demo"),
    }
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + taken))
        squatter.listen()
        done = _run_block(name, env)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port + taken}" in done.stdout
