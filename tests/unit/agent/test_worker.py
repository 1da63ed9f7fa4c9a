"""``sidecar exec`` (``sidecar.agent.worker``): an unmodified command run as one attempt of a
task - claimed, wired to the proxy, heartbeated, stopped if its lease is lost, released
saying how it ended, and exited with its status.

The flow runs in-process against the real control API (over the in-memory store and a
manual clock); the agent is a real, short ``sh`` command.  The pure parts (environment,
exit mapping, relay discovery) are checked on their own."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.agent import worker
from sidecar.agent.leasekeeper import Held
from sidecar.agent.trust import PG_CHANNEL_BINDING, TRUST_VARIABLES
from sidecar.control.keys import ProxyInfo
from sidecar.domain.model import AgentExit, Checkpoint
from sidecar.errors import LeaseHeld, SidecarUnreachable

AT = datetime(2026, 1, 1, 14, 0, tzinfo=UTC)
PROXY = "http://127.0.0.1:7301"


# ---- the agent's environment -------------------------------------------------------


def test_every_proxy_variable_carries_the_task_and_attempt_as_credentials():
    held = Held("issue/312", "att 1", 1, AT)
    env = worker.agent_environment({}, PROXY, "/ca.pem", held)
    expected = "http://issue%2F312:att%201@127.0.0.1:7301"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == expected
    assert env["GIT_HTTP_PROXY_AUTHMETHOD"] == "basic", "git sends them without a challenge"
    assert (env["SIDECAR_TASK"], env["SIDECAR_ATTEMPT_ID"], env["SIDECAR_GENERATION"]) == (
        "issue/312",
        "att 1",
        "1",
    )


def test_every_client_trusts_the_bundle():
    env = worker.agent_environment(
        {"SSL_CERT_FILE": "/old.pem"}, PROXY, "/ca.pem", Held("t", "a", 1, AT)
    )
    assert {name: env[name] for name in TRUST_VARIABLES} == dict.fromkeys(
        TRUST_VARIABLES, "/ca.pem"
    )


def test_libpq_clients_bind_to_the_attempt_keeping_their_own_options():
    held = Held("312", "att-2", 2, AT)
    fresh = worker.agent_environment({}, PROXY, "/ca.pem", held)
    assert fresh["PGOPTIONS"] == "-c sidecar.task=312 -c sidecar.attempt=att-2"
    kept = worker.agent_environment({"PGOPTIONS": "-c search_path=app"}, PROXY, "/ca.pem", held)
    assert kept["PGOPTIONS"] == "-c search_path=app -c sidecar.task=312 -c sidecar.attempt=att-2"
    name, value = PG_CHANNEL_BINDING
    assert fresh[name] == value
    chosen = worker.agent_environment({name: "require"}, PROXY, "/ca.pem", held)
    assert chosen[name] == "require", "a channel binding the agent chose is left alone"


def test_the_environment_it_starts_from_is_left_untouched():
    base = {"PATH": "/usr/bin", "PGOPTIONS": "-c x=1"}
    env = worker.agent_environment(base, PROXY, "/ca.pem", Held("312", "att-1", 1, AT))
    assert base == {"PATH": "/usr/bin", "PGOPTIONS": "-c x=1"}
    assert env["PATH"] == "/usr/bin"


def test_an_isolated_jvm_without_a_trust_store_gets_no_java_options():
    env = worker.agent_environment({}, PROXY, "/ca.pem", Held("312", "a", 1, AT), isolated=True)
    assert "JAVA_TOOL_OPTIONS" not in env
    assert worker.java_options("127.0.0.1", 7301, "", isolated=True) == ""


def test_the_last_checkpoint_file_is_never_written_over(tmp_path):
    checkpoint = Checkpoint("312", 1, "READ", "att-1", 1, {}, AT)
    (tmp_path / "last_checkpoint.json").write_text("someone else's")
    with pytest.raises(FileExistsError):
        worker.write_last_checkpoint(tmp_path, checkpoint)
    assert (tmp_path / "last_checkpoint.json").read_text() == "someone else's"


# ---- how an agent ended, and the status exec exits with -----------------------------


def test_a_signal_with_no_name_is_still_named():
    assert worker.exit_of(-200) == AgentExit(signal="SIG200")


@pytest.mark.parametrize(
    ("error", "end"),
    [
        (OSError(errno.ENOENT, "gone"), AgentExit(exit_code=127, error="command not found")),
        (PermissionError(errno.EACCES, "no"), AgentExit(exit_code=126, error="permission denied")),
        (
            OSError(errno.ENOEXEC, "Exec format"),
            AgentExit(exit_code=126, error="cannot be started"),
        ),
    ],
)
def test_a_command_that_cannot_start_ends_as_a_shell_would_say(error, end):
    assert worker.not_started(error) == end


# ---- the sidecar's PostgreSQL relay, as it reports it -------------------------------


def test_the_relay_the_sidecar_reports_is_used_and_its_servers_port_redirected():
    isolation = worker.with_sidecars_relay(
        worker.Isolation(), {"pg_relay": "127.0.0.1:7432", "pg_upstream_port": 6543}
    )
    assert (isolation.pg_relay, isolation.pg_ports) == (("127.0.0.1", 7432), (5432, 6543))
    ipv6 = worker.with_sidecars_relay(worker.Isolation(), {"pg_relay": "[::1]:7432"})
    assert (ipv6.pg_relay, ipv6.pg_ports) == (("::1", 7432), (5432,))


def test_a_relay_exec_was_told_of_or_none_reported_is_left_as_it_is():
    told = worker.Isolation(pg_relay=("10.0.0.5", 7000))
    assert worker.with_sidecars_relay(told, {"pg_relay": "127.0.0.1:7432"}) is told
    none = worker.Isolation()
    assert worker.with_sidecars_relay(none, {"pg_relay": None}) is none
    same = worker.with_sidecars_relay(
        none, {"pg_relay": "127.0.0.1:7432", "pg_upstream_port": 5432}
    )
    assert same.pg_ports == (5432,)


# ---- the whole attempt, against the control API -------------------------------------


@pytest.fixture
async def control(make_client) -> str:
    proxy = ProxyInfo(PROXY, "explicit", "/nowhere/ca.pem", "/nowhere/bundle.pem")
    client = await make_client(proxy=proxy)
    return str(client.make_url("/")).rstrip("/")


async def exec_(control: str, *command: str, out: io.StringIO | None = None, **options: Any) -> int:
    settings: dict[str, Any] = {"task": "312", "worker": "worker-a", "ttl_s": 60, "wait_s": 0}
    return await worker.run(
        list(command),
        control_url=control,
        token=None,
        notes=worker.Notes(stream=out or io.StringIO()),
        **(settings | options),
    )


async def test_exec_exits_with_the_agents_status_and_the_store_keeps_how_it_ended(
    control, memory_store
):
    out = io.StringIO()
    assert await exec_(control, "sh", "-c", "exit 3", out=out) == 3
    attempt = await memory_store.attempt("att-0001")
    assert attempt.exit == AgentExit(exit_code=3)
    view = await memory_store.task_view("312")
    assert view.state.lease.released_at is not None, "the lease was given up"
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sidecar exec: claimed task 312: attempt att-0001, generation 1")
    assert lines[-1] == (
        "sidecar exec: attempt att-0001 of task 312 ended: exit 3; "
        "effects: 0 recorded, 0 replayed, 0 refused, 0 blocked"
    )


async def test_the_agent_runs_wired_to_the_proxy_with_its_last_checkpoint_at_hand(
    control, memory_store, clock, tmp_path
):
    first = await memory_store.claim("312", "worker-0", 1)
    await memory_store.append_checkpoint(
        "312", first.attempt_id, first.generation, "PATCHED", {"sha": "abc"}
    )
    clock.advance(1)
    seen = tmp_path / "seen.json"
    script = (
        "import json, os, sys; env = os.environ; path = env['SIDECAR_LAST_CHECKPOINT'];"
        "json.dump({'env': {k: env[k] for k in ('HTTPS_PROXY', 'SIDECAR_TASK',"
        " 'SIDECAR_ATTEMPT_ID', 'SIDECAR_GENERATION', 'SIDECAR_LAST_STAGE', 'SSL_CERT_FILE')},"
        " 'path': path, 'checkpoint': json.load(open(path))}, open(sys.argv[1], 'w'))"
    )
    assert await exec_(control, "python3", "-c", script, str(seen)) == 0
    agent = json.loads(seen.read_text())
    assert agent["env"] == {
        "HTTPS_PROXY": "http://312:att-0002@127.0.0.1:7301",
        "SIDECAR_TASK": "312",
        "SIDECAR_ATTEMPT_ID": "att-0002",
        "SIDECAR_GENERATION": "2",
        "SIDECAR_LAST_STAGE": "PATCHED",
        "SSL_CERT_FILE": "/nowhere/bundle.pem",
    }
    assert (agent["checkpoint"]["stage"], agent["checkpoint"]["outputs"]) == (
        "PATCHED",
        {"sha": "abc"},
    )
    assert not exists(agent["path"]), "the private copy is removed after the attempt"


def exists(path: str) -> bool:
    return Path(path).exists()


class Said(io.StringIO):
    """exec's notes, with a way to wait until it said its first line (the claim)."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed = asyncio.Event()

    def write(self, text: str) -> int:
        if "claimed task" in text:
            self.claimed.set()
        return super().write(text)


async def test_an_agent_killed_by_a_signal_exits_as_shells_report_it(control, memory_store):
    assert await exec_(control, "sh", "-c", "kill -TERM $$") == 128 + 15
    assert (await memory_store.attempt("att-0001")).exit == AgentExit(signal="SIGTERM")


async def test_a_command_that_does_not_exist_exits_127_and_says_so_to_the_store(
    control, memory_store
):
    assert await exec_(control, "/nonexistent/agent") == 127
    attempt = await memory_store.attempt("att-0001")
    assert attempt.exit == AgentExit(exit_code=127, error="command not found")


async def test_an_agent_whose_lease_is_lost_is_stopped_and_exec_exits_75(
    control, memory_store, clock
):
    said = Said()
    running = asyncio.ensure_future(exec_(control, "sleep", "30", ttl_s=0.6, out=said))
    async with asyncio.timeout(5):
        await said.claimed.wait()
    clock.advance(1)  # its lease runs out; another worker takes the task over
    await memory_store.claim("312", "worker-b", 60)
    async with asyncio.timeout(worker.GRACE_S):
        assert await running == worker.LEASE_LOST_EXIT
    attempt = await memory_store.attempt("att-0001")
    assert attempt.exit == AgentExit(signal="SIGTERM", lease_lost=True)
    assert (await memory_store.task_view("312")).state.lease.worker == "worker-b"


async def test_a_task_held_by_another_worker_starts_no_agent(control, memory_store, tmp_path):
    await memory_store.claim("312", "worker-b", 60)
    marker = tmp_path / "ran"
    with pytest.raises(LeaseHeld):
        await exec_(control, "touch", str(marker))
    assert not marker.exists()
    assert [a.worker for a in (await memory_store.task_view("312")).attempts] == ["worker-b"]


async def test_no_sidecar_at_the_control_address_starts_no_agent(unused_tcp_port, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(SidecarUnreachable, match="start one with `sidecar serve`"):
        await exec_(f"http://127.0.0.1:{unused_tcp_port}", "touch", str(marker))
    assert not marker.exists()
    assert os.listdir(tmp_path) == []
