"""A GitHub-shaped world of real processes: emulator, model endpoint, sidecar, agents.

    world = GitHubWorld.start(tmp)                  # repo acme/app seeded on main
    agent = world.agent("worker-a")                 # sidecar exec ... -- the demo agent
    agent.wait_for("^pushed"); agent.kill_group()   # evicted after its push
    world.agent("worker-b").wait_for("^done")
    world.branches(), world.pulls()                 # the outside world, counted

The sidecar routes api.github.com and github.com to the emulator and api.openai.com to
the model, with the github and llm-cache packs (or rules you give); starting, killing
and restarting it is :class:`sidecar.testing.sidecar.SidecarProcess`'s.  Used by
``sidecar demo`` (and ``demo --matrix``) and the GitHub acceptance tests.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from sidecar.rules.packs import packs_dir
from sidecar.testing.processes import Child, scratch_env
from sidecar.testing.sidecar import HasSidecar, SidecarProcess

TASK = "312"
REPO = "acme/app"
SOURCE = '''"""The orders endpoint."""


def create_order(order):
    return {"status": "created", "order": order}
'''
PUBLIC_URLS = ("--api-url", "https://api.github.com", "--web-url", "https://github.com")


def call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One JSON request (authenticated for the emulator); returns (status, body)."""
    answer = requests.request(
        method, url, json=body, headers={"Authorization": "token test-token"}, timeout=30
    )
    try:
        return answer.status_code, answer.json()
    except ValueError:
        return answer.status_code, answer.text


def start_emulator(
    root: Path, name: str, *, public_urls: bool, late: Sequence[str] = ()
) -> tuple[Child, str]:
    """A GitHub emulator with REPO seeded (README and app.py on main).

    With ``public_urls`` its objects name api.github.com and github.com: it sits behind
    the sidecar's routes.  Otherwise they name its own address, for agents calling it
    directly.
    """
    args = ["emulate", "github", "--listen", "127.0.0.1:0", "--data-dir", str(root / name)]
    args += list(PUBLIC_URLS) if public_urls else []
    for spec in late:
        args += ["--late", spec]
    emulator = Child.python("sidecar", *args, stderr_path=root / f"{name}.log")
    github = emulator.wait_for(r"github emulator ready (\S+)").group(1)
    owner, repo = REPO.split("/")
    call("POST", f"{github}/orgs/{owner}/repos", {"name": repo, "auto_init": True})
    call(
        "PUT",
        f"{github}/repos/{REPO}/contents/app.py",
        {
            "message": "Add the orders endpoint",
            "content": base64.b64encode(SOURCE.encode()).decode(),
            "branch": "main",
        },
    )
    return emulator, github


def routes(github: str, model: str) -> list[str]:
    """``serve --route`` values: GitHub's names to the emulator, OpenAI's to the model."""
    return [f"api.github.com={github}", f"github.com={github}", f"api.openai.com={model}"]


def agent_argv(task: str) -> list[str]:
    """The demo's coding agent, working on ``task`` in REPO."""
    return [sys.executable, "-m", "sidecar.demo.agent", "--task", task, "--repo", REPO]


def outside_world(github: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """REPO's branches other than main (name -> commit) and its pull requests."""
    _, state = call("GET", f"{github}/_emulator/state")
    found = state["repos"][REPO]
    branches = {n: b["sha"] for n, b in found["branches"].items() if n != "main"}
    return branches, list(found["pulls"])


@dataclass
class GitHubWorld(HasSidecar):
    root: Path
    emulator: Child
    github: str
    model: Child
    model_url: str
    rules: list[Path]
    agents: list[Child] = field(default_factory=list)
    process: SidecarProcess = field(init=False)

    def __post_init__(self) -> None:
        served = routes(self.github, self.model_url)
        self.process = SidecarProcess(self.root / "sidecar", self.root, self.rules, served)

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        rules: Sequence[Path] = (),
        late: Sequence[str] = (),
        model_thinking_s: float = 0.0,
        sidecar_env: dict[str, str] | None = None,
    ) -> GitHubWorld:
        root.mkdir(parents=True, exist_ok=True)
        emulator, github = start_emulator(root, "github", public_urls=True, late=late)
        model = Child.python(
            "sidecar.demo.model", "--thinking-s", str(model_thinking_s),
            stderr_path=root / "model.log",
        )  # fmt: skip
        model_url = model.wait_for(r"model ready (\S+)").group(1)
        chosen = list(rules) or [packs_dir() / "github.yaml", packs_dir() / "llm-cache.yaml"]
        world = cls(root, emulator, github, model, model_url, chosen)
        world.start_sidecar(sidecar_env)
        return world

    def start_sidecar(self, env: dict[str, str] | None = None) -> None:
        """Start, or restart on the same data and ports, the sidecar."""
        self.process.start(env)

    def agent(
        self, worker: str, *, ttl_s: float = 4.0, wait_s: float = 30.0, task: str = TASK
    ) -> Child:
        """The demo's coding agent, run under `sidecar exec` as one attempt of ``task``."""
        log = self.root / f"agent-{len(self.agents) + 1}-{worker}.log"
        agent = self.process.exec_agent(
            task, worker, agent_argv(task), ttl_s=ttl_s, wait_s=wait_s, log=log,
            env=scratch_env(self.root),
        )  # fmt: skip
        self.agents.append(agent)
        return agent

    def command(self, worker: str, *argv: str, ttl_s: float = 4.0, wait_s: float = 30.0) -> Child:
        """Any command under `sidecar exec` (e.g. the git CLI) as one attempt of TASK."""
        log = self.root / f"command-{len(self.agents) + 1}-{worker}.log"
        child = self.process.exec_agent(TASK, worker, argv, ttl_s=ttl_s, wait_s=wait_s, log=log)
        self.agents.append(child)
        return child

    def branches(self) -> dict[str, str]:
        return outside_world(self.github)[0]

    def pulls(self) -> list[dict[str, Any]]:
        return outside_world(self.github)[1]

    def effects(self, task: str = TASK) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.process.get(f"/v1/tasks/{task}/effects")["effects"]
        return found

    def attempts(self, task: str = TASK) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.process.get(f"/v1/tasks/{task}")["attempts"]
        return found

    def close(self) -> None:
        for agent in self.agents:
            agent.end()
        self.process.terminate()
        self.model.kill()
        self.emulator.terminate()
