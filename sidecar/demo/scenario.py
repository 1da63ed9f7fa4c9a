"""The worked scenario of the seed (task #312), end to end, with real processes.

With the sidecar: worker A claims task 312 and runs the agent; the agent reads the
repository, asks the model for a patch, pushes it - and is SIGKILLed with its worker
(a container eviction) before it opens the pull request.  A's lease expires; worker B
claims the task (generation 2) and runs the agent again from the top.  The model call is
answered from the log (the same patch), the push is replayed (the first commit stands),
the pull request is opened once.  A's late checkpoint write is refused; A, rescheduled,
runs the task again as a new attempt and everything it does is replayed.

Without the sidecar: the same agent, the same kill, the same restarts - and the outcome
counted on the emulator shows what that produces.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sidecar.testing.github import (
    REPO,
    TASK,
    GitHubWorld,
    call,
    outside_world,
    start_emulator,
)
from sidecar.testing.processes import Child, scratch_env

LABELS = {
    "openai.chat.completions": "model call",
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


def with_sidecar(world: GitHubWorld, timeline: Timeline) -> tuple[dict[str, str], int]:
    _step(timeline, "sidecar up: rules github + llm-cache; api.github.com, github.com and "
          "api.openai.com routed to the local stand-ins")  # fmt: skip

    def worker(name: str, who: str, until: str) -> Child:
        agent = world.agent(name)
        _follow(agent, who, timeline, until)
        return agent

    worker("worker-a", "agent A", "pushed").kill_group()
    _step(timeline, "SIGKILL worker A and its agent (evicted) - the PR is not opened yet")
    worker("worker-b", "agent B", "done").kill()
    a, b = world.attempts()
    _step(timeline, f"A's lease ran out at {a['lease_until'][11:19]}; worker B took "
          f"over as {b['attempt_id']} (generation {b['generation']})")  # fmt: skip
    token = {"attempt_id": a["attempt_id"], "generation": a["generation"]}
    status, answer = call(
        "POST", f"{world.control}/v1/tasks/{TASK}/checkpoints", token | {"stage": "PATCH_APPLIED"}
    )
    timeline.add("worker A", f"comes back, writes checkpoint PATCH_APPLIED with generation "
                 f"{a['generation']}: {status} {answer.get('code', 'ACCEPTED')}")  # fmt: skip
    _step(timeline, "worker A is rescheduled and runs the task again, as a new attempt")
    worker("worker-a", "agent A'", "done").kill()
    names = dict(zip((x["attempt_id"] for x in world.attempts()), ("A", "B", "A'"), strict=False))
    for effect in world.effects():
        label = LABELS.get(effect["rule"], effect["rule"])
        for event in effect["events"]:
            if event["event"] in {"completed", "replayed", "probed", "divergent"}:
                timeline.add(
                    "sidecar",
                    f"{label}: {event['event']} for {names.get(event['attempt_id'], '?')}",
                    at=timeline.at_wall_clock(event["at"]),
                )
    return world.branches(), len(world.pulls())


def without_sidecar(root: Path, model: str, timeline: Timeline) -> tuple[dict[str, str], int]:
    emulator, github = start_emulator(root, "github-direct", public_urls=False)
    env = (
        os.environ
        | scratch_env(root)
        | {
            "GITHUB_API_URL": github,
            "GITHUB_SERVER_URL": github,
            "OPENAI_BASE_URL": f"{model}/v1",
        }
    )
    with emulator:
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
        branches, pulls = outside_world(github)
    return branches, len(pulls)


def main(keep: Path | None = None) -> int:
    """Run both halves; exit 0 only if the sidecar's half ends with one branch and one PR."""
    root = keep or Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    print(f"effect-sidecar demo - task #{TASK}: worker A is evicted right after its push, "
          f"worker B resumes, A comes back (logs: {root})\n")  # fmt: skip
    print("With the sidecar:")
    guarded = Timeline()
    world = GitHubWorld.start(root)
    try:
        branches, pulls = with_sidecar(world, guarded)
        guarded.print()
        shown = ", ".join(f"{name} at {sha[:12]}" for name, sha in branches.items())
        print(f"  => {len(branches)} branch ({shown}), {pulls} pull request\n")

        print("Without the sidecar (the same agent, kill and restarts):")
        bare = Timeline()
        loose_branches, loose_pulls = without_sidecar(root, world.model_url, bare)
        bare.print()
        print(f"  => {len(loose_branches)} branches, {loose_pulls} pull requests\n")
    finally:
        world.close()
    if len(branches) == 1 and pulls == 1:
        print(f"OK: with the sidecar one branch and one pull request; without it "
              f"{len(loose_branches)} branches and {loose_pulls} pull requests.")  # fmt: skip
        return 0
    print("FAILED: the run with the sidecar did not end with one branch and one pull request.")
    return 1
