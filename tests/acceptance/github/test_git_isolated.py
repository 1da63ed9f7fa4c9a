"""git, unmodified, under ``sidecar exec`` (isolated by default where the machine allows
it): the same push in two attempts reaches GitHub once - recorded the first time; the
second time git itself reads the refs (through the sidecar) and has nothing to send."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sidecar.agent.isolation import netns

FIXED = "2026-12-01T10:00:00Z"  # both attempts make the very same commit


def test_the_same_push_in_a_second_attempt_reaches_github_once(
    make_world: Any, tmp_path: Path
) -> None:
    world = make_world()
    repo = tmp_path / "work"
    git = f"git -c user.name=A -c user.email=a@example.com -C {repo}"
    script = tmp_path / "push.sh"
    script.write_text(
        "set -e\n"
        f"export GIT_AUTHOR_DATE={FIXED} GIT_COMMITTER_DATE={FIXED}\n"
        f"rm -rf {repo} && git clone -q https://github.com/acme/app.git {repo}\n"
        f"{git} checkout -q -b agent/312\n"
        f"echo 'validate input' > {repo}/app.py\n"
        f'{git} commit -qam "validate input"\n'
        f"{git} push origin agent/312 2>&1\n"
    )
    outputs = []
    for worker in ("worker-a", "worker-b"):
        attempt = world.command(worker, "bash", str(script))
        assert attempt.proc.wait(timeout=60) == 0, "\n".join(attempt.lines)
        outputs.append("\n".join(attempt.lines))
    if netns.unavailable() is None:
        assert not any("WITHOUT network isolation" in out for out in outputs), outputs
    (push,) = [e for e in world.effects() if e["rule"] == "github.git.push"]
    assert [event["event"] for event in push["events"]] == ["pending", "completed"]
    assert "Everything up-to-date" in outputs[1], outputs[1]
    assert list(world.branches()) == ["agent/312"]
