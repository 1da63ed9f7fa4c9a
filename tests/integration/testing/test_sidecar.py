"""One real `sidecar serve` process driven by :class:`SidecarProcess`: the READY line
read, the control API called, a command run under `sidecar exec` against it, and a
SIGKILL and a restart on the same data and ports."""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.testing.sidecar import SidecarProcess, exec_argv


def test_it_starts_runs_an_attempt_and_restarts_on_the_same_data_and_ports(tmp_path: Path):
    sidecar = SidecarProcess(tmp_path / "data", tmp_path, args=["--log-level", "debug"])
    assert sidecar.serve_argv()[-2:] == ["--log-level", "debug"]  # given last: they win
    sidecar.start()
    try:
        assert sidecar.control.startswith("http://127.0.0.1:")
        assert sidecar.proxy.startswith("http://127.0.0.1:")
        assert Path(sidecar.ca_cert).is_file()
        assert sidecar.pg == ""
        assert sidecar.call("GET", "/v1/tasks/no-such-task")[0] == 404

        show = "import os; print('task', os.environ['SIDECAR_TASK'], os.environ['MARK'])"
        with sidecar.exec_agent(
            "312", "worker-a", [sys.executable, "-c", show], ttl_s=5, wait_s=0,
            env={"MARK": "here"}, log=tmp_path / "agent.log",
        ) as child:  # fmt: skip
            assert child.wait_for(r"^task (\S+) (\S+)$").group(1, 2) == ("312", "here")
            assert child.wait() == 0
        (attempt,) = sidecar.get("/v1/tasks/312")["attempts"]
        assert attempt["worker"] == "worker-a"
        granted = sidecar.post("/v1/tasks/312/claim", {"worker": "w", "ttl_s": 30})
        assert granted["generation"] == 2

        addresses = (sidecar.control, sidecar.proxy)
        assert sidecar.kill() == -9
        assert not sidecar.alive()
        sidecar.start()
        assert sidecar.alive()
        assert (sidecar.control, sidecar.proxy) == addresses
        attempts = sidecar.get("/v1/tasks/312")["attempts"]
        assert [a["attempt_id"] for a in attempts][-1] == granted["attempt_id"]
        logs = sorted(p.name for p in tmp_path.glob("sidecar-*.log"))
        assert logs == ["sidecar-1.log", "sidecar-2.log"]
    finally:
        sidecar.terminate()


def test_the_exec_argv_names_the_attempt_and_its_lease():
    argv = exec_argv("http://c", "7", "w", ["run", "it"], ttl_s=4.0, wait_s=2.5, options=["-x"])
    assert argv[3:] == [
        "exec", "--control", "http://c", "--task", "7", "--worker", "w",
        "--lease-ttl-s", "4", "--wait-s", "2.5", "-x", "--", "run", "it",
    ]  # fmt: skip
