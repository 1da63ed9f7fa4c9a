"""A whole local stack of real processes: upstream, sidecar, and agents run under it.

    stack = Stack.start(tmp_path, rules=[...], hosts=["api.example-payments.com"])
    agent = stack.exec_agent("312", "agent.py", "--order", "7")
    agent.wait_for("charged")
    stack.kill_sidecar(); stack.start_sidecar()       # same data, same ports
    stack.counts()                                    # what the upstream received

The sidecar's traffic for every name in ``hosts`` is routed to the counting upstream
(``sidecar.testing.upstream``), so agents call real-looking HTTPS URLs that never leave
the machine.  Used by the acceptance tests.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.testing.processes import Child
from sidecar.testing.sidecar import SidecarProcess


@dataclass
class Stack:
    root: Path
    upstream: Child
    upstream_url: str
    rules: list[Path]
    hosts: list[str]
    sidecar_args: list[str] = field(default_factory=list)
    agents: list[Child] = field(default_factory=list)
    process: SidecarProcess = field(init=False)

    def __post_init__(self) -> None:
        routes = [f"{host}={self.upstream_url}" for host in self.hosts]
        self.process = SidecarProcess(self.data_dir, self.root, routes=routes, timeout_s=10)

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        rules: Sequence[Path],
        hosts: Sequence[str],
        sidecar_args: Sequence[str] = (),
        sidecar_env: dict[str, str] | None = None,
    ) -> Stack:
        root.mkdir(parents=True, exist_ok=True)
        upstream = Child.python("sidecar.testing.upstream", stderr_path=root / "upstream.log")
        url = upstream.wait_for(r"upstream ready (\S+)").group(1)
        stack = cls(root, upstream, url, list(rules), list(hosts), list(sidecar_args))
        try:
            stack.start_sidecar(env=sidecar_env)
        except BaseException:
            stack.close()  # the caller never gets the stack: do not leave the upstream running
            raise
        return stack

    @property
    def data_dir(self) -> Path:
        return self.root / "sidecar-data"

    @property
    def sidecar(self) -> Child | None:
        return self.process.child

    @property
    def control_url(self) -> str:
        return self.process.control

    @property
    def proxy_url(self) -> str:
        return self.process.proxy

    @property
    def ca_cert(self) -> str:
        return self.process.ca_cert

    def start_sidecar(self, env: dict[str, str] | None = None) -> None:
        """Start (or restart, on the same data and ports) the sidecar."""
        self.process.rules, self.process.args = self.rules, self.sidecar_args
        self.process.start(env)

    def kill_sidecar(self) -> int:
        return self.process.kill()

    def exec_agent(
        self,
        task: str,
        script: Path | str,
        *args: str,
        worker: str = "worker",
        ttl_s: float = 30,
        wait_s: float = 0,
        exec_args: Sequence[str] = (),
    ) -> Child:
        """``sidecar exec --task TASK -- python SCRIPT ARGS`` against this stack's sidecar."""
        agent = self.process.exec_agent(
            task, worker, [sys.executable, str(script), *args], ttl_s=ttl_s, wait_s=wait_s,
            options=exec_args, log=self.root / f"agent-{len(self.agents) + 1}.log",
        )  # fmt: skip
        self.agents.append(agent)
        return agent

    def counts(self) -> dict[str, Any]:
        """What the upstream received: ``{"requests": {"POST /x": n}, "charges": n, ...}``."""
        found: dict[str, Any] = self._get(f"{self.upstream_url}/_upstream/counts")
        return found

    def things(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._get(f"{self.upstream_url}/_upstream/things")
        return found

    def effects(self, task: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.process.get(f"/v1/tasks/{task}/effects")["effects"]
        return found

    def task(self, task: str) -> dict[str, Any]:
        found: dict[str, Any] = self.process.get(f"/v1/tasks/{task}")
        return found

    def wait_for_lease(self, task: str, timeout: float = 15.0) -> dict[str, Any]:
        """Block until someone holds ``task``'s lease (e.g. ``serve --task`` claiming it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                lease: dict[str, Any] | None = self.task(task)["lease"]
            except urllib.error.HTTPError:
                lease = None
            if lease is not None and lease["live"]:
                return lease
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody claimed task {task} within {timeout}s")
            time.sleep(0.05)

    def metrics(self) -> str:
        """The sidecar's Prometheus exposition."""
        with urllib.request.urlopen(f"{self.control_url}/metrics", timeout=10) as response:
            text: str = response.read().decode()
        return text

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for path in sorted(self.root.glob("sidecar-*.log")):
            for line in path.read_text().splitlines():
                if line.startswith("{"):
                    lines.append(json.loads(line))
        return lines

    @staticmethod
    def _get(url: str) -> Any:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)

    def close(self) -> None:
        for agent in self.agents:
            agent.end()
        self.process.terminate()
        self.upstream.kill()
