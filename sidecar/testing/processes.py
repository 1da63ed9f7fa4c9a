"""Starting real child processes, waiting for what they print, and killing them.

Used by kill tests (SIGKILL at a chosen moment) and by the commands that reproduce the
seed's scenarios.  Output is read line by line from a pipe on a background thread so a
chatty child never blocks on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path


def scratch_env(root: Path) -> dict[str, str]:
    """The environment that gives an agent its temporary files in ``root/agent-tmp``
    (``TMPDIR``): an agent killed on purpose leaves them beside the logs of the run that
    killed it, not loose in /tmp."""
    scratch = root / "agent-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return {"TMPDIR": str(scratch)}


class ProcessFailed(RuntimeError):
    """A child did not print what was awaited, or died first."""


class Child:
    """A child process whose stdout lines are collected as they arrive."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stderr_path: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        # argv comes from this package's own callers, never from outside input.
        self.proc = subprocess.Popen(  # noqa: S603
            self.argv,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group: signals reach only it
        )
        self.lines: list[str] = []
        self._eof = False
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"child-{self.pid}", daemon=True)
        self._reader.start()

    @classmethod
    def python(
        cls,
        module: str,
        *args: str,
        env: dict[str, str] | None = None,
        stderr_path: Path | None = None,
    ) -> Child:
        """``python -m module args...`` with this interpreter."""
        return cls([sys.executable, "-m", module, *args], env=env, stderr_path=stderr_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._arrived:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._arrived.notify_all()
        self.proc.stdout.close()
        with self._arrived:
            self._eof = True
            self._arrived.notify_all()

    def wait_for(self, pattern: str, timeout: float = 30.0, *, since: int = 0) -> re.Match[str]:
        """Block until a stdout line (from line number ``since`` on) matches ``pattern``."""
        compiled = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = since
        with self._arrived:
            while True:
                for line in self.lines[seen:]:
                    if m := compiled.search(line):
                        return m
                seen = len(self.lines)
                if self._eof:
                    raise ProcessFailed(
                        f"{self.argv[:4]} exited ({self.proc.wait()}) before printing "
                        f"{pattern!r}{self.last_words()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProcessFailed(
                        f"{self.argv[:4]} did not print {pattern!r} within {timeout}s"
                        f"{self.last_words()}"
                    )
                self._arrived.wait(left)

    def last_words(self, lines: int = 12) -> str:
        """The end of what the child printed (stdout as read so far, and its stderr
        file), for a failure to say why it happened: an agent's log is gone with the
        test's temporary directory."""
        said = [f"\n  stdout, last lines: {line}" for line in self.lines[-5:]]
        if self.stderr_path is not None:
            with contextlib.suppress(OSError), self.stderr_path.open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 8192))
                tail = log.read().decode(errors="replace").splitlines()[-lines:]
                said += [f"\n  {self.stderr_path.name}: {line}" for line in tail]
        return "".join(said)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the child to exit on its own, and for its last stdout lines to be
        read: ``proc.wait()`` alone can return before the reader thread saw them."""
        status = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)
        return status

    def kill(self) -> int:
        """SIGKILL the child (no cleanup runs in it) and reap it; return its exit status."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        status = self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        self._close()
        return status

    def kill_group(self) -> int:
        """SIGKILL the child and everything it started (its own process group): what
        happens to a container that is evicted."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.kill()

    def end(self) -> int:
        """Tear-down: SIGKILL the child and everything it started even if frozen (a
        SIGSTOPped group neither exits nor dies of SIGTERM), and reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.kill()

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return self.kill()
        self._reader.join(timeout=10)
        self._close()
        return self.proc.returncode

    def _close(self) -> None:
        if not isinstance(self._stderr, int):
            self._stderr.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()  # reaps and closes files even if the child already exited
