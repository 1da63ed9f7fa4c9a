"""A coding agent, as unmodified agents are: it knows nothing of effect-sidecar.

    python -m sidecar.demo.agent --task 312 --repo acme/app

It reads the repository (PyGithub), asks a model for a patch (OpenAI-style HTTP), commits
it on the branch the model named and force-pushes it (the git CLI), opens a pull request
and comments on it (PyGithub).  Endpoints come from the usual variables - GITHUB_API_URL,
GITHUB_SERVER_URL, OPENAI_BASE_URL - and default to the public services; proxies and
trusted CAs come from the environment, as for any program.  It prints one line per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import requests
from github import Auth, Github


def say(step: str, detail: str) -> None:
    print(f"{step} {detail}", flush=True)


def git(workdir: Path, *args: str) -> str:
    identity = ["-c", "user.name=Coding Agent", "-c", "user.email=agent@example.com"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=workdir, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--task",
        default=os.environ.get("SIDECAR_TASK"),
        help="the task (default: SIDECAR_TASK, which `sidecar exec` sets)",
    )
    parser.add_argument("--repo", required=True, help="owner/name")
    args = parser.parse_args()
    if not args.task:
        parser.error("--task is required (or SIDECAR_TASK)")
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com")
    web = os.environ.get("GITHUB_SERVER_URL", "https://github.com")
    model = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
    token = os.environ.get("GITHUB_TOKEN", "demo-token")

    github = Github(auth=Auth.Token(token), base_url=api)
    repo = github.get_repo(args.repo)
    source = repo.get_contents("app.py").decoded_content.decode()  # type: ignore[union-attr]
    say("read", f"{args.repo} app.py ({len(source)} bytes)")

    prompt = {"task": args.task, "source": source, "ask": "add input validation"}
    answer = requests.post(
        f"{model}/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": json.dumps(prompt)}]},
        headers={"Authorization": "Bearer sk-demo-not-a-real-key"},
        timeout=30,
    )
    answer.raise_for_status()
    plan = json.loads(answer.json()["choices"][0]["message"]["content"])
    say("generated", f"patch for branch {plan['branch']}")

    with tempfile.TemporaryDirectory(prefix="agent-") as tmp:
        workdir = Path(tmp) / "repo"
        subprocess.run(
            ["git", "clone", "-q", f"{web}/{args.repo}.git", str(workdir)],
            check=True,
            capture_output=True,
        )
        git(workdir, "checkout", "-q", "-b", plan["branch"])
        for name, content in plan["files"].items():
            (workdir / name).write_text(content)
        git(workdir, "add", ".")
        git(workdir, "commit", "-q", "-m", plan["title"])
        sha = git(workdir, "rev-parse", "HEAD")
        pushed = subprocess.run(
            ["git", "push", "--force", "origin", plan["branch"]],
            cwd=workdir,
            capture_output=True,
            text=True,
            check=False,
        )
        for line in pushed.stderr.splitlines():
            if line.startswith("remote: "):
                say("git", line.rstrip())
        pushed.check_returncode()
        say("pushed", f"{plan['branch']} {sha[:12]}")

    pull = repo.create_pull(
        title=plan["title"], body=plan["body"], head=plan["branch"], base="main"
    )
    say("opened", f"PR #{pull.number} {pull.html_url}")
    pull.create_issue_comment(f"Task {args.task}: patch generated, tested and pushed by the agent.")
    say("commented", f"on PR #{pull.number}")
    say("done", f"task {args.task}")


if __name__ == "__main__":
    main()
