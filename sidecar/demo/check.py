"""The outside world is right for one task of the demo agent: one branch, one pull
request from it, one comment on it - counted on the GitHub emulator itself.

    python -m sidecar.demo.check GITHUB_URL      (the task: SIDECAR_MATRIX_TASK)

``sidecar demo --matrix`` runs it after every cell.
"""

from __future__ import annotations

import os
import sys

from sidecar.testing.github import REPO, call, outside_world


def main() -> int:
    github, task = sys.argv[1], os.environ["SIDECAR_MATRIX_TASK"]
    prefix = f"agent/{task}-"
    branches, pulls = outside_world(github)
    mine = [name for name in branches if name.startswith(prefix)]
    opened = [pull for pull in pulls if str(pull.get("head", "")).startswith(prefix)]
    comments = 0
    for pull in opened:
        _, found = call("GET", f"{github}/repos/{REPO}/issues/{pull['number']}/comments")
        comments += len(found) if isinstance(found, list) else 0
    print(f"task {task}: {len(mine)} branch(es), {len(opened)} pull request(s), "
          f"{comments} comment(s)")  # fmt: skip
    return 0 if (len(mine), len(opened), comments) == (1, 1, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
