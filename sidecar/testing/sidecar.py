"""One `sidecar serve` process - started, SIGKILLed, restarted on the same data and
ports - and commands run under `sidecar exec` against it.

    sidecar = SidecarProcess(root / "data", logs=root, rules=[...], routes=["api.x=URL"])
    sidecar.start()                            # waits for its READY line: control, proxy, ca
    agent = sidecar.exec_agent("312", "worker-a", ["python", "agent.py"], log=root / "a.log")
    sidecar.kill(); sidecar.start()            # no cleanup runs; same data, same ports
    sidecar.get("/v1/tasks/312")               # the control API, as JSON

Every world that runs a real sidecar composes one (and :class:`HasSidecar` names its
child and addresses): ``sidecar demo``'s (:mod:`sidecar.testing.github`), each
``sidecar matrix`` cell's (:mod:`sidecar.matrix.stack`) and the test worlds in
``tests/support``.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.testing.processes import Child, ProcessFailed

#: The line `sidecar serve` prints once it listens (``pg=`` only with ``--pg-upstream``).
READY = r"effect-sidecar ready control=(\S+) proxy=(\S+)(?: pg=(\S+))? ca=(\S+)"

#: How a process is started: ``(argv, env, stderr log, cwd) -> Child``.
type Spawn = Callable[[list[str], dict[str, str], Path, Path | None], Child]


def spawn_child(argv: list[str], env: dict[str, str], log: Path, cwd: Path | None) -> Child:
    return Child(argv, env=env, cwd=cwd, stderr_path=log)


def exec_argv(
    control: str,
    task: str,
    worker: str,
    argv: Sequence[str],
    *,
    ttl_s: float,
    wait_s: float,
    options: Sequence[str] = (),
) -> list[str]:
    """``sidecar exec`` running ``argv`` as one attempt of ``task`` for ``worker``."""
    return [
        sys.executable, "-m", "sidecar", "exec", "--control", control,
        "--task", task, "--worker", worker,
        "--lease-ttl-s", f"{ttl_s:g}", "--wait-s", f"{wait_s:g}", *options, "--", *argv,
    ]  # fmt: skip


def _body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


@dataclass
class SidecarProcess:
    """A `sidecar serve` on ``data_dir``, its stderr in ``logs/sidecar-N.log``.

    ``args`` are more ``serve`` options, given last (so ``--log-level`` there wins).  The
    addresses are read from the READY line; a restart listens on the same ones.
    """

    data_dir: Path
    logs: Path
    rules: Sequence[Path] = ()
    routes: Sequence[str] = ()  # HOST=URL
    pg_upstream: str | None = None
    args: Sequence[str] = ()
    spawn: Spawn = spawn_child
    token: str | None = None  # the control API's bearer token, if it wants one
    timeout_s: float = 30.0  # for one control API call
    child: Child | None = None
    control: str = ""
    proxy: str = ""
    pg: str = ""
    ca_cert: str = ""

    def serve_argv(self) -> list[str]:
        """``python -m sidecar serve ...``, on the addresses of the last start if any."""
        argv = [sys.executable, "-m", "sidecar", "serve", "--data-dir", str(self.data_dir)]
        argv += ["--log-level", "info"]
        argv += ["--control-listen", self.control.removeprefix("http://") or "127.0.0.1:0"]
        argv += ["--proxy-listen", self.proxy.removeprefix("http://") or "127.0.0.1:0"]
        if self.pg_upstream:
            argv += ["--pg-upstream", self.pg_upstream]
            argv += ["--pg-listen", self.pg.removeprefix("postgresql://") or "127.0.0.1:0"]
        for path in self.rules:
            argv += ["--rules", str(path)]
        for route in self.routes:
            argv += ["--route", route]
        return argv + list(self.args)

    def start(
        self, env: Mapping[str, str] | None = None, *, environ: Mapping[str, str] | None = None
    ) -> None:
        """Start it, or restart it (after reaping the last one) on the same data and ports;
        return once it is ready.  Its environment is ``environ`` (this process's by
        default) with ``env`` on top."""
        if self.child is not None:
            self.child.kill()  # reap the previous one (and close its log file)
        log = self.logs / f"sidecar-{len(list(self.logs.glob('sidecar-*.log'))) + 1}.log"
        full = dict(os.environ if environ is None else environ) | dict(env or {})
        self.child = self.spawn(self.serve_argv(), full, log, None)
        try:
            ready = self.child.wait_for(READY, timeout=60)
        except ProcessFailed:
            self.child.kill()
            raise
        self.control, self.proxy, pg, self.ca_cert = ready.group(1, 2, 3, 4)
        self.pg = pg or ""

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def alive(self) -> bool:
        return self.child is not None and self.child.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL it (no cleanup runs in it) and reap it; its exit status."""
        assert self.child is not None
        return self.child.kill()

    def terminate(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (SIGKILL after ``timeout``), if it was ever started."""
        return self.child.terminate(timeout) if self.child is not None else None

    # ---- the control API --------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request to the control API; (status, JSON or text body), whatever the status."""
        try:
            status, raw = self._request(method, path, body)
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        return status, _body(raw)

    def get(self, path: str) -> Any:
        """The JSON answer to ``GET path``; raises :class:`urllib.error.HTTPError` on a
        status of 400 or more."""
        return json.loads(self._request("GET", path, None)[1])

    def post(self, path: str, body: Any) -> Any:
        """The JSON answer to ``POST path`` with ``body`` as JSON (raising like :meth:`get`)."""
        return json.loads(self._request("POST", path, body)[1])

    def _request(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        # The world's own sidecar, or the one `sidecar matrix --control` names.
        request = urllib.request.Request(  # noqa: S310
            f"{self.control}{path}", data=data, headers=headers, method=method
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310
            return answer.status, answer.read()

    # ---- agents ---------------------------------------------------------------------

    def exec_agent(
        self,
        task: str,
        worker: str,
        argv: Sequence[str],
        *,
        log: Path,
        ttl_s: float,
        wait_s: float,
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        """``argv`` under `sidecar exec` against this sidecar, as one attempt of ``task``;
        ``options`` go to `sidecar exec`, ``env`` on top of this process's environment."""
        command = exec_argv(
            self.control, task, worker, argv, ttl_s=ttl_s, wait_s=wait_s, options=options
        )
        return self.spawn(command, dict(os.environ) | dict(env or {}), log, cwd)


class HasSidecar:
    """For a world whose sidecar is :attr:`process`: the process and its addresses by
    the names the world's callers use."""

    process: SidecarProcess

    @property
    def sidecar(self) -> Child | None:
        return self.process.child

    @property
    def control(self) -> str:
        return self.process.control

    @property
    def proxy(self) -> str:
        return self.process.proxy

    @property
    def pg(self) -> str:
        return self.process.pg
