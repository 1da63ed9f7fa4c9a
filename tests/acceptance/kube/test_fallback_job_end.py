"""A Job without native sidecars ends: the agent's command from deploy/README.md, run for
real beside a real `sidecar serve`, stops the sidecar when the agent is done.

In the fallback shape the sidecar is a regular container, so a Job's pod completes only
once it has exited too. The README's block (between ``job-end`` markers) is what an
operator pastes into the agent's container; this test runs its script with ``sh``, the
agent replaced by a stand-in that exits with a failure code, with the variables the
injector gives an env-proxy app container (the control API's loopback address must not
be sent to the proxy). The sidecar must exit 0 by itself, its lease released, and the
agent's exit code must be the container's.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sidecar.domain.model import TaskView
from sidecar.kube.containers import CONTROL_PORT, TOKEN_DIR, app_env
from sidecar.store import create_store
from sidecar.testing.processes import Child

pytestmark = pytest.mark.acceptance

README = Path(__file__).parents[3] / "deploy" / "README.md"
AGENT = "python -m agent --task 312"  # what the README's agent runs


async def task_view(data: Path, task: str) -> TaskView | None:
    store = create_store(f"sqlite:///{data / 'effects.db'}")
    await store.open()
    try:
        return await store.task_view(task)
    finally:
        await store.close()


def documented_script() -> str:
    text = README.read_text(encoding="utf-8")
    pattern = r"<!-- job-end:start -->\n```yaml\n(.*?)```\n<!-- job-end:end -->"
    block = re.search(pattern, text, re.DOTALL)
    assert block, "deploy/README.md lost its job-end block"
    (container,) = yaml.safe_load(block.group(1))["containers"]
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    assert AGENT in script
    assert f"127.0.0.1:{CONTROL_PORT}/v1/shutdown" in script
    assert f"{TOKEN_DIR}/token" in script, "the shutdown needs the control token"
    return str(script)


def test_the_documented_agent_command_stops_the_sidecar_and_keeps_the_agents_code(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    token = tmp_path / "token"
    token.write_text("s3cret-job-token\n")
    sidecar = Child.python(
        "sidecar", "serve", "--data-dir", str(data), "--task", "312", "--worker", "agent-312-x",
        "--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
        "--control-token-file", str(token),
        stderr_path=tmp_path / "sidecar.log",
    )  # fmt: skip
    with sidecar:
        ready = sidecar.wait_for(r"control=http://127.0.0.1:(\d+) proxy=(\S+)", timeout=30)
        port, proxy = ready.group(1), ready.group(2)
        script = documented_script().replace(AGENT, f"{sys.executable} -c 'raise SystemExit(3)'")
        script = script.replace(f"127.0.0.1:{CONTROL_PORT}", f"127.0.0.1:{port}")
        script = script.replace(f"{TOKEN_DIR}/token", str(token))
        env = {"PATH": os.environ["PATH"]}
        env |= {item["name"]: item["value"] for item in app_env(transparent=False)}
        env |= {name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}

        agent = subprocess.run(
            ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
        )

        assert agent.returncode == 3, f"the agent's own code is the container's: {agent.stderr}"
        assert sidecar.proc.wait(timeout=15) == 0, "the sidecar stopped by itself, cleanly"
    view = asyncio.run(task_view(data, "312"))
    assert view is not None
    assert view.state.lease is not None
    assert view.state.lease.released_at is not None, "the next pod need not wait it out"
