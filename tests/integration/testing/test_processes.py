"""A child that dies, or stays silent, is reported with its last words."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sidecar.testing.processes import Child, ProcessFailed

SAYS_AND_DIES = (
    "import sys\n"
    "print('working on it', flush=True)\n"
    "for n in range(30): print(f'trace line {n}', file=sys.stderr)\n"
    "print('RuntimeError: the push was refused', file=sys.stderr)\n"
    "sys.exit(3)\n"
)


def test_a_child_that_exits_first_is_reported_with_its_stdout_and_the_end_of_its_stderr(
    tmp_path: Path,
) -> None:
    log = tmp_path / "agent.log"
    with (
        Child([sys.executable, "-c", SAYS_AND_DIES], stderr_path=log) as child,
        pytest.raises(ProcessFailed) as failed,
    ):
        child.wait_for("^done ")
    message = str(failed.value)
    assert "exited (3) before printing '^done '" in message
    assert "stdout, last lines: working on it" in message
    assert "agent.log: RuntimeError: the push was refused" in message
    assert "agent.log: trace line 29" in message
    assert "trace line 10" not in message  # only the end of a long log


def test_a_silent_child_is_reported_with_what_it_wrote_to_stderr(tmp_path: Path) -> None:
    log = tmp_path / "silent.log"
    script = "import sys, time\nprint('stuck on a lock', file=sys.stderr)\ntime.sleep(30)\n"
    with (
        Child([sys.executable, "-c", script], stderr_path=log) as child,
        pytest.raises(ProcessFailed) as failed,
    ):
        child.wait_for("^ready", timeout=1.0)
    assert "did not print '^ready' within 1.0s" in str(failed.value)
    assert "silent.log: stuck on a lock" in str(failed.value)


def test_a_child_without_a_log_is_reported_with_its_stdout_only() -> None:
    with (
        Child([sys.executable, "-c", "print('bye')"]) as child,
        pytest.raises(ProcessFailed) as failed,
    ):
        child.wait_for("^never")
    assert str(failed.value).endswith("stdout, last lines: bye")
