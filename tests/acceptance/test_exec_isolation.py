"""``sidecar exec --isolate`` (the default where possible) with real agents of every kind.

One stack (counting upstream reached only through ``--route api.things.test``, a sidecar
with the things rules), one agent (tests/acceptance/isolation/clients.py) running, as
they come, Python requests, httpx and aiohttp, Node 20's fetch and https, Java's
HttpClient (``java Agent.java``) and curl - each POSTs one thing. Run twice, as two
attempts of a task: each effect reaches the upstream once and is replayed the second
time, whether the client honoured the proxy variables (requests, httpx, curl) or
ignored them and was redirected (aiohttp, Node, Java). A direct connection to a port the
namespace does not intercept is refused at once. Then the same Node and Java agents
without isolation, to pin down what the knobs alone achieve on this machine. And psql
and psycopg through the PostgreSQL relay from inside the namespace: psql dials the real
server's 127.0.0.1:5432 and is redirected to the relay.

Needs root, iproute2, iptables, util-linux, node, java, curl, psql and PostgreSQL at
127.0.0.1:5432; skipped with the reason otherwise, failed under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.agent.isolation import netns
from sidecar.rules.packs import packs_dir
from sidecar.testing.processes import Child
from tests.acceptance.conftest import REPO
from tests.support.ports import free_port
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

HERE = Path(__file__).parent / "isolation"
CLIENTS = ["requests", "httpx", "aiohttp", "aiohttp-80", "node-fetch", "node-https", "java", "curl"]
PG_URL = os.environ.get("SIDECAR_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def need(*tools: str) -> None:
    reason = netns.unavailable()
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if reason is None and missing:
        reason = f"missing {', '.join(missing)}"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the isolation test cannot run: {reason}")
        pytest.skip(reason)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    need("node", "java", "curl")
    made = Stack.start(
        tmp_path, rules=[REPO / "tests/acceptance/proxy/things.yaml"], hosts=["api.things.test"]
    )
    try:
        yield made
    finally:
        made.close()


def sidecar_exec(
    stack: Stack, task: str, *command: str, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "exec", "--task", task, "--control",
         stack.control_url, *flags, "--", *command],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def outcomes(stdout: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\S+) (\d+ \S+)$", stdout, re.MULTILINE)}


def test_every_client_goes_through_the_sidecar_once_when_isolated(stack: Stack) -> None:
    upstream_port = stack.upstream_url.rsplit(":", 1)[1]
    runs = []
    for _ in (1, 2):
        started = time.monotonic()
        done = sidecar_exec(stack, "iso-1", sys.executable, str(HERE / "clients.py"), upstream_port)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        assert "WARNING" not in done.stderr, done.stderr
        runs.append((done.stdout, time.monotonic() - started))
    first, second = (outcomes(stdout) for stdout, _ in runs)
    assert first == dict.fromkeys(CLIENTS, "201 recorded"), runs[0][0]
    assert second == dict.fromkeys(CLIENTS, "201 replayed"), runs[1][0]
    names = sorted(thing["name"] for thing in stack.things())
    assert names == sorted(CLIENTS), names  # each effect reached the upstream once
    for stdout, _ in runs:
        # Ports nobody intercepts: refused at once, not left to time out.
        assert re.search(r"^direct api.things.test:8080 ConnectionRefusedError 0\.\d", stdout, re.M)
        assert re.search(rf"^direct 127.0.0.1:{upstream_port} ConnectionRefusedError", stdout, re.M)
        assert re.search(r"^direct 2001:db8::1:443 OSError 0\.\d", stdout, re.M), stdout


def test_without_isolation_node_20_and_java_are_not_bound(stack: Stack) -> None:
    """The knobs alone: NODE_USE_ENV_PROXY=1 is set but Node 20 ignores it (fetch dials
    the routed name itself and cannot resolve it); Java's JAVA_TOOL_OPTIONS take it to
    the proxy, but without the attempt's credentials (428 task_unbound)."""
    node = sidecar_exec(
        stack,
        "iso-2",
        "node",
        str(HERE / "fetch.mjs"),
        "fetch",
        "plain-node",
        flags=("--no-isolate",),
    )
    assert node.returncode == 0, node.stderr
    assert "node-fetch error ENOTFOUND" in node.stdout, node.stdout
    java = sidecar_exec(
        stack, "iso-2", "java", str(HERE / "Agent.java"), "plain-java", flags=("--no-isolate",)
    )
    assert java.returncode == 0, java.stderr
    assert "java 428 refused" in java.stdout, java.stdout
    assert "Picked up JAVA_TOOL_OPTIONS" in java.stderr
    assert stack.things() == []


PG_AGENT = r"""
import asyncio, os, subprocess, sys, asyncpg, psycopg
table, relay = sys.argv[1], sys.argv[2]
# psql dials the real server's address: redirected to the relay.
done = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-c",
                       f"CREATE TABLE {table} (id int PRIMARY KEY)", os.environ["REAL_PG"]],
                      capture_output=True, text=True)
print("psql", done.returncode, done.stdout.strip(), done.stderr.strip(), flush=True)
# psycopg dials the relay itself (its port is mirrored into the namespace).
with psycopg.connect(f"postgresql://postgres@{relay}/test", autocommit=True) as conn:
    conn.execute(f"CREATE INDEX {table}_idx ON {table} (id)")
    print("psycopg indexed", flush=True)
# asyncpg reads no PGOPTIONS: redirected, and bound by exec's BindRequest.
async def alter():
    conn = await asyncpg.connect(os.environ["REAL_PG"])
    await conn.execute(f"ALTER TABLE {table} ADD COLUMN note text")
    await conn.close()
asyncio.run(alter())
print("asyncpg altered", flush=True)
"""


def test_psql_psycopg_and_asyncpg_through_the_relay_when_isolated(tmp_path: Path) -> None:
    need("psql")
    relay = f"127.0.0.1:{free_port()}"
    sidecar = Child.python(
        "sidecar", "serve", "--data-dir", str(tmp_path / "data"), "--control-listen",
        "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0", "--rules",
        str(packs_dir() / "postgres.yaml"), "--pg-upstream", "postgresql://127.0.0.1:5432",
        "--pg-listen", relay, stderr_path=tmp_path / "sidecar.log",
    )  # fmt: skip
    control = sidecar.wait_for(r"effect-sidecar ready control=(\S+)", timeout=60).group(1)
    table = f"iso_{secrets.token_hex(4)}"
    agent = tmp_path / "pg_agent.py"
    agent.write_text(PG_AGENT)
    try:
        for attempt in (1, 2):
            done = subprocess.run(
                [sys.executable, "-m", "sidecar", "exec", "--task", "iso-pg", "--control",
                 control, "--pg-relay", relay, "--",
                 sys.executable, str(agent), table, relay],
                capture_output=True, text=True, timeout=120, check=False,
                env=os.environ | {"REAL_PG": PG_URL},
            )  # fmt: skip
            assert done.returncode == 0, f"attempt {attempt}: {done.stdout}\n{done.stderr}"
            assert "psql 0 CREATE TABLE" in done.stdout, done.stdout
            assert "psycopg indexed" in done.stdout, done.stdout
            assert "asyncpg altered" in done.stdout, done.stdout
        with urllib.request.urlopen(f"{control}/v1/tasks/iso-pg/effects") as answer:
            effects = json.load(answer)["effects"]
        assert len(effects) == 3, effects
        for effect in effects:
            assert effect["state"] == "completed", effect
            assert "replayed" in [event["event"] for event in effect["events"]], effect
        query = f"SELECT count(*) FROM pg_indexes WHERE indexname = '{table}_idx'"
        count = subprocess.run(
            ["psql", "-X", "-tA", "-c", query, PG_URL],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert count.stdout.strip() == "1"
        query = f"SELECT count(*) FROM information_schema.columns WHERE table_name = '{table}'"
        columns = subprocess.run(
            ["psql", "-X", "-tA", "-c", query, PG_URL], capture_output=True, text=True, check=True
        )
        assert columns.stdout.strip() == "2"  # id, and note added once
    finally:
        subprocess.run(["psql", "-X", "-c", f"DROP TABLE IF EXISTS {table}", PG_URL], check=False,
                       capture_output=True)  # fmt: skip
        sidecar.terminate()


UNPRIVILEGED = r"""
set -e
# The interpreter, the virtualenv or the checkout may live under a folder only root can
# enter (/root is 0700 where pyenv puts Python; a CI clone may be in a 0700 temporary
# folder): in this command's own mount namespace each such folder is replaced by an open
# one holding the same tree, so user nobody runs what a user would run.
IFS=:
for hidden in $HIDDEN; do
  open=$(mktemp -d) && chmod 755 "$open"
  for entry in "$hidden"/* "$hidden"/.[!.]*; do
    [ -e "$entry" ] || continue
    name=${entry##*/}
    if [ -d "$entry" ]; then mkdir "$open/$name"; else touch "$open/$name"; fi
    mount --rbind "$entry" "$open/$name"
  done
  mount --rbind "$open" "$hidden"
done
unset IFS
exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"
"""


def hidden_folders(*paths: Path) -> str:
    """The outermost folder above each of ``paths`` that others may not enter, joined
    with ":" ("" if there is none)."""
    found: list[str] = []
    for path in paths:
        for folder in reversed(path.parents):
            if not folder.stat().st_mode & 0o001:
                if str(folder) not in found:
                    found.append(str(folder))
                break
    return ":".join(found)


def test_an_unprivileged_user_is_isolated_in_a_user_namespace_of_its_own() -> None:
    """exec run by user nobody: the namespace is made in a user namespace of its own
    (no root anywhere), and every client is still caught - recorded once, replayed."""
    need("node", "java", "curl", "setpriv")
    if os.geteuid() != 0:
        pytest.skip("the test drops from root to nobody")
    root = Path(tempfile.mkdtemp(prefix="sidecar-rootless-"))
    root.chmod(0o755)  # nobody reads the sidecar's CA bundle below it
    stack = Stack.start(
        root, rules=[REPO / "tests/acceptance/proxy/things.yaml"], hosts=["api.things.test"]
    )
    try:
        # The sidecar keeps its data to itself; nobody needs only the public CA bundle.
        stack.data_dir.chmod(0o711)
        (stack.data_dir / "ca-bundle.pem").chmod(0o644)
        upstream_port = stack.upstream_url.rsplit(":", 1)[1]
        hidden = hidden_folders(
            Path(sys.executable).resolve(), Path(sys.prefix) / "bin", REPO / "sidecar"
        )
        runs = []
        for _ in (1, 2):
            done = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "--",
                 "sh", "-c", UNPRIVILEGED, "unprivileged",
                 sys.executable, "-m", "sidecar", "exec", "--task", "iso-nobody", "--isolate",
                 "--control", stack.control_url, "--",
                 sys.executable, str(HERE / "clients.py"), upstream_port],
                capture_output=True, text=True, timeout=180, check=False, cwd=REPO,
                env=os.environ | {"HIDDEN": hidden, "HOME": str(root)},
            )  # fmt: skip
            assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
            runs.append(done.stdout)
        assert outcomes(runs[0]) == dict.fromkeys(CLIENTS, "201 recorded"), runs[0]
        assert outcomes(runs[1]) == dict.fromkeys(CLIENTS, "201 replayed"), runs[1]
        assert sorted(thing["name"] for thing in stack.things()) == sorted(CLIENTS)
        assert re.search(r"^direct api.things.test:8080 ConnectionRefusedError", runs[0], re.M)
    finally:
        stack.close()
        shutil.rmtree(root, ignore_errors=True)
