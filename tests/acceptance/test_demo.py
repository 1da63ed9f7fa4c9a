"""`sidecar demo` - the README's main job - as a new user runs it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.acceptance


def test_the_demo_ends_with_one_branch_and_one_pr_and_shows_the_duplicates_without(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "demo", "--keep", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "=> 1 branch (agent/312-" in out
    assert ", 1 pull request" in out
    assert "409 stale_generation" in out
    assert "git push: replayed for B" in out
    assert "model call: replayed for B" in out
    without = re.search(r"=> (\d+) branches, (\d+) pull requests", out)
    assert without, out
    assert int(without.group(1)) >= 2, "without the sidecar the restart made another branch"
    assert int(without.group(2)) >= 2, "and another pull request"
    # Agent A is SIGKILLed on purpose, in both halves: its clone stays beside the logs,
    # not loose in /tmp (one more left there by every run).
    assert len(list((tmp_path / "demo" / "agent-tmp").glob("agent-*"))) >= 2
