"""Sidecars on several nodes sharing one PostgreSQL store, as real processes.

    store = SharedStore.create()                         # schema es_test_<hex>, fresh
    a = Node.start(tmp / "a", "node-a", store.url)       # `sidecar serve --store ...`
    b = Node.start(tmp / "b", "node-b", store.url)       # another process, other ports
    a.post("/v1/tasks/312/claim", {"worker": "w", "ttl_s": 2})   # -> (200, {...})
    store.refusals("312")                                # read from the store itself
    store.drop()

:class:`GitHubNodes` adds the outside world of the GitHub scenarios (the emulator and
the demo's model, one of each, shared by every node) and runs the demo agent under
`sidecar exec` against a chosen node.  :func:`freeze_after_push` freezes a worker - its
`sidecar exec`, the agent and git, i.e. its process group - the moment git has recorded
a branch push as accepted, before the agent does anything else: no timing race.

Used by the cross-node acceptance tests.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import requests

from sidecar.domain.model import FenceRefusal
from sidecar.rules.packs import packs_dir
from sidecar.store import create_store
from sidecar.testing.github import (
    REPO,
    TASK,
    agent_argv,
    call,
    outside_world,
    routes,
    start_emulator,
)
from sidecar.testing.processes import Child, ProcessFailed, scratch_env
from sidecar.testing.sidecar import HasSidecar, SidecarProcess
from tests.support.postgres import server_url

type Answer = tuple[int, Any]


def _json(response: requests.Response) -> Answer:
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


# ---- the shared store ------------------------------------------------------------------


@dataclass
class SharedStore:
    """A PostgreSQL store of its own: a fresh schema on the server, dropped on :meth:`drop`."""

    server: str
    schema: str

    @classmethod
    def create(cls, server: str | None = None, prefix: str = "es_test") -> SharedStore:
        """A new schema name; the first sidecar opened on :attr:`url` creates the tables."""
        return cls(server or server_url(), f"{prefix}_{secrets.token_hex(5)}")

    @property
    def url(self) -> str:
        return f"{self.server}?schema={self.schema}"

    def refusals(self, task: str) -> list[FenceRefusal]:
        """The fenced writes of ``task``, read from the store (not through a sidecar)."""

        async def read() -> list[FenceRefusal]:
            async with create_store(self.url, read_only=True) as store:
                return await store.refusals(task)

        return asyncio.run(read())

    def drop(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


# ---- one node: a `sidecar serve` process -------------------------------------------------


@dataclass
class Node(HasSidecar):
    """One `sidecar serve` on the shared store, with its own data dir (CA) and ports."""

    name: str
    root: Path
    store_url: str
    process: SidecarProcess

    @classmethod
    def start(
        cls,
        root: Path,
        name: str,
        store_url: str,
        *,
        routes: Sequence[str] = (),
        rules: Sequence[Path] = (),
        env: dict[str, str] | None = None,
    ) -> Node:
        """``routes`` are ``HOST=URL``; no ``rules`` means the shipped default packs."""
        root.mkdir(parents=True, exist_ok=True)
        process = SidecarProcess(
            root / "data", root, rules, routes, args=["--store", store_url], timeout_s=30
        )
        process.start(env)
        return cls(name, root, store_url, process)

    @property
    def sidecar(self) -> Child:
        assert self.process.child is not None
        return self.process.child

    # -- the control API ------------------------------------------------------------

    def get(self, path: str) -> Answer:
        return self.process.call("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> Answer:
        return self.process.call("POST", path, body)

    def claim(self, task: str, worker: str, ttl_s: float) -> Answer:
        return self.post(f"/v1/tasks/{task}/claim", {"worker": worker, "ttl_s": ttl_s})

    def checkpoint(
        self,
        task: str,
        attempt_id: str,
        generation: int,
        stage: str,
        outputs: dict[str, Any] | None = None,
    ) -> Answer:
        token = {"attempt_id": attempt_id, "generation": generation}
        return self.post(
            f"/v1/tasks/{task}/checkpoints", token | {"stage": stage, "outputs": outputs or {}}
        )

    def task(self, task: str) -> dict[str, Any]:
        status, found = self.get(f"/v1/tasks/{task}")
        if status != 200:
            raise AssertionError(f"GET /v1/tasks/{task} on {self.name}: {status} {found}")
        state: dict[str, Any] = found
        return state

    def effects(self, task: str) -> list[dict[str, Any]]:
        effects: list[dict[str, Any]] = self.get(f"/v1/tasks/{task}/effects")[1]["effects"]
        return effects

    # -- the proxy --------------------------------------------------------------------

    def through_proxy(
        self,
        method: str,
        url: str,
        *,
        task: str,
        attempt_id: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """One request through this node's proxy, acting for ``attempt_id`` of ``task`` as
        `sidecar exec` binds its agent (proxy credentials ``TASK:ATTEMPT``, the node's CA
        trusted); returns (status, headers, JSON or text body)."""
        _, info = self.get("/v1/proxy")
        proxy = info["proxy_url"].replace(
            "://", f"://{quote(task, safe='')}:{quote(attempt_id, safe='')}@", 1
        )
        answer = requests.request(
            method, url, json=body, headers=headers, timeout=30,
            proxies={"http": proxy, "https": proxy}, verify=info["ca_bundle"],
        )  # fmt: skip
        status, found = _json(answer)
        return status, dict(answer.headers), found

    def stop(self) -> int:
        return self.sidecar.terminate()


# ---- freezing a worker at a chosen point ----------------------------------------------

HOOK = """#!/bin/sh
# reference-transaction hook: once git has committed a remote-tracking ref other than the
# default branch's - a branch push the remote accepted - freeze the whole process group
# (`sidecar exec`, the agent, git and this hook) with SIGSTOP.  Only SIGCONT goes on.
[ "$1" = committed ] || exit 0
while read -r old new ref; do
  case "$ref" in
    refs/remotes/*/HEAD | refs/remotes/*/{default}) ;;
    refs/remotes/*) echo "$ref $new" > "{marker}"; kill -s STOP 0 ;;
  esac
done
exit 0
"""


@dataclass(frozen=True)
class PushFreeze:
    """Where the hook of :func:`freeze_after_push` leaves word that it fired."""

    hooks: Path
    marker: Path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` plus the git configuration (by environment) that runs the hook."""
        index = int(base.get("GIT_CONFIG_COUNT", "0"))
        return base | {
            "GIT_CONFIG_COUNT": str(index + 1),
            f"GIT_CONFIG_KEY_{index}": "core.hooksPath",
            f"GIT_CONFIG_VALUE_{index}": str(self.hooks),
        }


def freeze_after_push(where: Path, default_branch: str = "main") -> PushFreeze:
    """A git hook folder that freezes its worker right after a branch push was accepted.

    git updates the remote-tracking ref only once the remote reported the push a success,
    and the sidecar answers a push only once it has recorded it: when the hook fires, the
    push is in the effect log as completed and the agent still waits for `git push` to return.
    """
    hooks = where / "hooks"
    hooks.mkdir(parents=True, exist_ok=True)
    marker = where / "frozen-after-push"
    hook = hooks / "reference-transaction"
    hook.write_text(HOOK.replace("{default}", default_branch).replace("{marker}", str(marker)))
    hook.chmod(0o755)
    return PushFreeze(hooks, marker)


def group_members(pgid: int) -> dict[int, str]:
    """pid -> state letter (``T`` when stopped) of every process in group ``pgid`` (Linux)."""
    members: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            members[int(entry.name)] = fields[0]
    return members


def wait_frozen(child: Child, freeze: PushFreeze, timeout: float = 60.0) -> tuple[str, str]:
    """Block until ``child``'s process group froze itself (see :func:`freeze_after_push`);
    return the pushed branch and the commit git pushed to it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise ProcessFailed(
                f"{child.argv[:4]} exited ({child.proc.returncode}) unfrozen{child.last_words()}"
            )
        if freeze.marker.exists():
            states = group_members(child.pid)
            # Stopped, or dead and waiting for a (stopped) parent to reap it.
            if states and all(state in "TtZX" for state in states.values()):
                ref, commit = freeze.marker.read_text().split()
                return ref.split("/", 3)[3], commit  # refs/remotes/<remote>/<branch>
        time.sleep(0.02)
    raise ProcessFailed(
        f"{child.argv[:4]} did not freeze after a push within {timeout}s{child.last_words()}"
    )


def freeze(child: Child) -> None:
    """SIGSTOP ``child`` and everything it started (its process group)."""
    os.killpg(child.pid, signal.SIGSTOP)


def thaw(child: Child) -> None:
    """SIGCONT ``child``'s process group."""
    os.killpg(child.pid, signal.SIGCONT)


# ---- the GitHub scenario on several nodes --------------------------------------------


@dataclass
class GitHubNodes:
    """One GitHub emulator and one model, and a sidecar per node on one shared store.

    Every node routes api.github.com and github.com to the emulator and api.openai.com to
    the model, with the github and llm-cache packs (or the rules given), like
    :class:`sidecar.testing.github.GitHubWorld` does for a single sidecar.
    """

    root: Path
    store_url: str
    emulator: Child
    github: str
    model: Child
    model_url: str
    rules: list[Path]
    nodes: dict[str, Node] = field(default_factory=dict)
    agents: list[Child] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        root: Path,
        store_url: str,
        names: Sequence[str] = ("node-a", "node-b"),
        *,
        rules: Sequence[Path] = (),
        model_thinking_s: float = 0.0,
    ) -> GitHubNodes:
        root.mkdir(parents=True, exist_ok=True)
        emulator, github = start_emulator(root, "github", public_urls=True)
        model = Child.python(
            "sidecar.demo.model", "--thinking-s", str(model_thinking_s),
            stderr_path=root / "model.log",
        )  # fmt: skip
        chosen = list(rules) or [packs_dir() / "github.yaml", packs_dir() / "llm-cache.yaml"]
        world = cls(root, store_url, emulator, github, model, "", chosen)
        try:
            world.model_url = model.wait_for(r"model ready (\S+)").group(1)
            for name in names:
                world.start_node(name)
        except BaseException:
            world.close()
            raise
        return world

    def start_node(self, name: str, env: dict[str, str] | None = None) -> Node:
        served = routes(self.github, self.model_url)
        node = Node.start(
            self.root / name, name, self.store_url, routes=served, rules=self.rules, env=env
        )
        self.nodes[name] = node
        return node

    def agent(
        self,
        node: str,
        worker: str,
        *,
        ttl_s: float = 4.0,
        wait_s: float = 30.0,
        task: str = TASK,
        freeze: PushFreeze | None = None,
    ) -> Child:
        """The demo's coding agent under `sidecar exec` on ``node``: one attempt of ``task``."""
        env = (freeze.env(dict(os.environ)) if freeze is not None else {}) | scratch_env(self.root)
        log = self.root / f"agent-{len(self.agents) + 1}-{worker}.log"
        agent = self.nodes[node].process.exec_agent(
            task, worker, agent_argv(task), ttl_s=ttl_s, wait_s=wait_s, env=env, log=log
        )
        self.agents.append(agent)
        return agent

    def branches(self) -> dict[str, str]:
        return outside_world(self.github)[0]

    def pulls(self) -> list[dict[str, Any]]:
        return outside_world(self.github)[1]

    def comments(self) -> int:
        """Comments on REPO's issues and pull requests, counted on the emulator."""
        _, state = call("GET", f"{self.github}/_emulator/state")
        count: int = state["repos"][REPO]["comments"]
        return count

    def close(self) -> None:
        for agent in self.agents:
            agent.end()
        for node in self.nodes.values():
            node.stop()
        self.model.kill()
        self.emulator.terminate()
