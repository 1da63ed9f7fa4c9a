"""The worked scenario of the seed (task #312), end to end, with real processes.

With the sidecar: worker A claims task 312 and runs the agent; the agent reads the
repository, asks the model for a patch, pushes it - and is SIGKILLed with its worker
(a container eviction) before it opens the pull request.  A's lease expires; worker B
claims the task (generation 2) and runs the agent again from the top.  The model call is
answered from the log (the same patch), the push is replayed (the first commit stands),
the pull request is opened once.  Then A's late checkpoint write is refused.

Without the sidecar: the same agent, the same kill, the same restart - and the outcome
counted on the emulator shows what that produces.
"""

from __future__ import annotations

import base64
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from sidecar.rulepacks import packs_dir
from sidecar.testing.processes import Child

TASK = "312"
REPO = "acme/app"
LEASE_S = 4.0
SOURCE = '''"""The orders endpoint."""


def create_order(order):
    return {"status": "created", "order": order}
'''
LABELS = {
    "llm.openai.chat_completions": "model call",
    "github.git.push": "git push",
    "github.pulls.create": "open pull request",
    "github.issues.comments.create": "comment on the pull request",
}


@dataclass
class Timeline:
    """What happened, by seconds since the demo started; printed once each half is over."""

    started: float = field(default_factory=time.monotonic)
    lines: list[tuple[float, str, str]] = field(default_factory=list)

    def add(self, who: str, what: str, at: float | None = None) -> None:
        when = (at if at is not None else time.monotonic()) - self.started
        self.lines.append((when, who, what))

    def at_wall_clock(self, iso: str) -> float:
        """A store timestamp on this timeline's clock."""
        wall = datetime.fromisoformat(iso).timestamp()
        return time.monotonic() - (time.time() - wall)

    def print(self) -> None:
        for when, who, what in sorted(self.lines):
            print(f"  {when:5.1f}s  {who:<9} {what}")


def _json(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    answer = requests.request(
        method, url, json=body, headers={"Authorization": "token demo-token"}, timeout=30
    )
    return answer.status_code, answer.json()


def _emulator(stack: ExitStack, root: Path, name: str, *, public_urls: bool) -> str:
    """A GitHub emulator holding REPO.  With ``public_urls`` its objects point at
    api.github.com and github.com (it sits behind the sidecar's routes); otherwise at
    itself (an agent talks to it directly)."""
    urls = ["--api-url", "https://api.github.com", "--web-url", "https://github.com"]
    emulator = stack.enter_context(
        Child.python(
            "sidecar",
            "emulate",
            "github",
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(root / name),
            *(urls if public_urls else []),
            stderr_path=root / f"{name}.log",
        )
    )
    github = emulator.wait_for(r"github emulator ready (\S+)").group(1)
    owner, repo = REPO.split("/")
    _json("POST", f"{github}/orgs/{owner}/repos", {"name": repo, "auto_init": True})
    source = base64.b64encode(SOURCE.encode()).decode()
    _json(
        "PUT",
        f"{github}/repos/{REPO}/contents/app.py",
        {"message": "Add the orders endpoint", "content": source, "branch": "main"},
    )
    return github


@contextmanager
def _services(root: Path) -> Iterator[tuple[str, str, str]]:
    """Two GitHub emulators (behind the sidecar, and direct) and the model endpoint."""
    with ExitStack() as stack:
        guarded = _emulator(stack, root, "github-behind-sidecar", public_urls=True)
        direct = _emulator(stack, root, "github-direct", public_urls=False)
        model = stack.enter_context(
            Child.python("sidecar.demo.model", stderr_path=root / "model.log")
        )
        yield guarded, direct, model.wait_for(r"model ready (\S+)").group(1)


def _outcome(github: str) -> tuple[list[str], int]:
    _, state = _json("GET", f"{github}/_emulator/state")
    found = state["repos"][REPO]
    branches = [
        f"{name} at {branch['sha'][:12]}"
        for name, branch in sorted(found["branches"].items())
        if name != "main"
    ]
    return branches, len(found["pulls"])


def _follow(agent: Child, who: str, timeline: Timeline, until: str) -> None:
    """Put the agent's lines on the timeline as they come, until one starts with ``until``."""
    seen = 0
    while True:
        agent.wait_for(r".", timeout=60, since=seen)
        while seen < len(agent.lines):
            line = agent.lines[seen]
            seen += 1
            timeline.add(who, line)
            if line.startswith(until):
                return


def _step(timeline: Timeline, what: str) -> None:
    timeline.add("demo", what)
    print(f"  ... {what}", flush=True)


def with_sidecar(root: Path, github: str, model: str, timeline: Timeline) -> tuple[list[str], int]:
    args = ["serve", "--data-dir", str(root / "sidecar"), "--control-listen", "127.0.0.1:0",
            "--proxy-listen", "127.0.0.1:0", "--log-level", "warning",
            "--rules", str(packs_dir() / "github.yaml"),
            "--rules", str(packs_dir() / "llm-cache.yaml"),
            "--route", f"api.github.com={github}", "--route", f"github.com={github}",
            "--route", f"api.openai.com={model}"]  # fmt: skip
    with Child.python("sidecar", *args, stderr_path=root / "sidecar.log") as sidecar:
        control = sidecar.wait_for(r"control=(\S+)").group(1)
        _step(timeline, "sidecar up: rules github + llm-cache; api.github.com, github.com and "
              "api.openai.com routed to the local stand-ins")  # fmt: skip

        def worker(name: str, who: str, until: str) -> Child:
            agent = Child.python(
                "sidecar", "exec", "--control", control, "--task", TASK, "--worker", name,
                "--ttl-s", str(LEASE_S), "--wait-s", "30", "--",
                sys.executable, "-m", "sidecar.demo.agent", "--task", TASK, "--repo", REPO,
                stderr_path=root / f"{who.replace(' ', '-')}.log",
            )  # fmt: skip
            _follow(agent, who, timeline, until)
            return agent

        first = worker("worker-a", "agent A", "pushed")
        first.kill_group()
        _step(timeline, "SIGKILL worker A and its agent (evicted) - the PR is not opened yet")
        worker("worker-b", "agent B", "done").kill()
        a, b = _json("GET", f"{control}/v1/tasks/{TASK}")[1]["attempts"]
        _step(timeline, f"A's lease ran out at {a['lease_until'][11:19]}; worker B took "
              f"over as {b['attempt_id']} (generation {b['generation']})")  # fmt: skip
        token = {"attempt_id": a["attempt_id"], "generation": a["generation"]}
        status, problem = _json(
            "POST", f"{control}/v1/tasks/{TASK}/checkpoints", token | {"stage": "PATCH_APPLIED"}
        )
        timeline.add("worker A", f"comes back, writes checkpoint PATCH_APPLIED with generation "
                     f"{a['generation']}: {status} {problem.get('code', 'ACCEPTED')}")  # fmt: skip
        _step(timeline, "worker A is rescheduled and runs the task again, as a new attempt")
        worker("worker-a", "agent A'", "done").kill()
        attempts = _json("GET", f"{control}/v1/tasks/{TASK}")[1]["attempts"]
        names = dict(zip((x["attempt_id"] for x in attempts), ("A", "B", "A'"), strict=False))
        for effect in _json("GET", f"{control}/v1/tasks/{TASK}/effects")[1]["effects"]:
            label = LABELS.get(effect["rule"], effect["rule"])
            for event in effect["events"]:
                if event["event"] in {"completed", "replayed", "probed", "divergent"}:
                    timeline.add(
                        "sidecar",
                        f"{label}: {event['event']} for {names.get(event['attempt_id'], '?')}",
                        at=timeline.at_wall_clock(event["at"]),
                    )
    return _outcome(github)


def without_sidecar(
    root: Path, github: str, model: str, timeline: Timeline
) -> tuple[list[str], int]:
    env = os.environ | {
        "GITHUB_API_URL": github,
        "GITHUB_SERVER_URL": github,
        "OPENAI_BASE_URL": f"{model}/v1",
    }
    for who, until in (("agent A", "pushed"), ("agent B", "done"), ("agent A'", "done")):
        agent = Child(
            [sys.executable, "-m", "sidecar.demo.agent", "--task", TASK, "--repo", REPO],
            env=env,
            stderr_path=root / f"direct-{who.replace(' ', '-')}.log",
        )
        with agent:
            _follow(agent, who, timeline, until)
            if until == "pushed":
                agent.kill_group()
                _step(timeline, "SIGKILL agent A after its push; B starts over, then A again")
    return _outcome(github)


def main(keep: Path | None = None) -> int:
    """Run both halves; exit 0 only if the sidecar's half ends with one branch and one PR."""
    root = keep or Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"effect-sidecar demo - task #{TASK}: worker A is evicted right after its push, "
          f"worker B resumes, A comes back (logs: {root})\n")  # fmt: skip
    with _services(root) as (github, direct, model):
        print("With the sidecar:")
        guarded = Timeline()
        branches, pulls = with_sidecar(root, github, model, guarded)
        guarded.print()
        print(f"  => {len(branches)} branch ({', '.join(branches)}), {pulls} pull request\n")

        print("Without the sidecar (the same agent, kill and restarts):")
        bare = Timeline()
        loose_branches, loose_pulls = without_sidecar(root, direct, model, bare)
        bare.print()
        print(f"  => {len(loose_branches)} branches, {loose_pulls} pull requests\n")
    if len(branches) == 1 and pulls == 1:
        print(f"OK: with the sidecar one branch and one pull request; without it "
              f"{len(loose_branches)} branches and {loose_pulls} pull requests.")  # fmt: skip
        return 0
    print("FAILED: the run with the sidecar did not end with one branch and one pull request.")
    return 1
