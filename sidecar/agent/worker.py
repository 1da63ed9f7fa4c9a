"""``sidecar exec``: run an unmodified agent command as one attempt of a task.

1. ask the running sidecar (control API) for its proxy address and CA bundle;
2. claim the task - a new attempt and generation - waiting for a live lease if asked;
3. start the command with ``HTTP(S)_PROXY=http://TASK:ATTEMPT@proxy`` (the credentials
   tell the proxy which attempt each request acts for) and the combined CA bundle in
   every variable some client reads;
   and the task's last checkpoint (``SIDECAR_LAST_STAGE``, ``SIDECAR_LAST_CHECKPOINT``);
4. heartbeat while it runs; if the lease is lost to another worker, stop the command
   (its writes are refused by the proxy anyway);
5. release the lease when it exits, saying how it ended (kept with the attempt), and
   exit with its status (127 for a command that does not exist, as shells do).

Unless ``quiet``, it says on stderr, one ``sidecar exec:`` line each, what it claimed,
whom it waits for, and how the attempt ended with the effects it recorded, replayed,
had refused and left blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from sidecar.agent import private_dir
from sidecar.agent.isolation import jks, netns, resolv
from sidecar.agent.isolation.forward import Forwarder
from sidecar.agent.leasekeeper import ControlLeases, Held, LeaseKeeper
from sidecar.agent.trust import PG_CHANNEL_BINDING, TRUST_VARIABLES
from sidecar.domain.model import AgentExit, Checkpoint
from sidecar.errors import ConfigError, LeaseHeld, SidecarError, SidecarUnreachable
from sidecar.runtime import tls_roots

log = logging.getLogger("sidecar.exec")

LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: the task goes on elsewhere; this attempt must stop
NOT_FOUND_EXIT = 127  # as shells exit for a command that does not exist
NOT_EXECUTABLE_EXIT = 126  # ... and for one that exists but cannot be run
GRACE_S = 5.0
WAIT_NOTE_EVERY_S = 4.0  # while waiting for a held lease: one line at most this often
SHOWN_REFUSALS = 5  # refusals whose problem text the summary quotes
SUMMARY_PAGES = 40  # pages of 500 effects the summary reads at most
SUMMARY_BUDGET_S = 10.0  # ... and for at most this long
PREFIX = "sidecar exec: "
LEASE_OPERATIONS = frozenset({"claim", "heartbeat", "release"})
HOSTS = Path("/etc/hosts")
RESOLV_CONF = Path("/etc/resolv.conf")


class Notes:
    """The ``sidecar exec:`` lines on stderr; ``quiet`` silences them."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.stream = stream
        self._last_wait = -WAIT_NOTE_EVERY_S

    def say(self, text: str) -> None:
        if not self.quiet:
            print(PREFIX + text, file=self.stream or sys.stderr, flush=True)

    def waiting(self, held: LeaseHeld, left_s: float) -> None:
        now = time.monotonic()
        if now - self._last_wait < WAIT_NOTE_EVERY_S:
            return
        self._last_wait = now
        self.say(
            f"task {held.task} is held by worker {held.holder} (attempt {held.attempt_id}) "
            f"until {held.expires_at.isoformat(timespec='seconds')}; waiting "
            f"(up to {left_s:.0f}s more)"
        )


def claim_line(held: Held, worker: str) -> str:
    last = held.last_checkpoint
    stage = "none" if last is None else f"{last.stage} (seq {last.seq})"
    return (
        f"claimed task {held.task}: attempt {held.attempt_id}, generation {held.generation}, "
        f"worker {worker}, last checkpoint {stage}"
    )


def write_last_checkpoint(folder: Path, last: Checkpoint | None) -> str:
    """The file ``SIDECAR_LAST_CHECKPOINT`` names (``""`` when there is no checkpoint):
    the checkpoint's outputs with its seq, stage, generation and attempt, readable by the
    owner only."""
    if last is None:
        return ""
    path = folder / "last_checkpoint.json"
    document = {
        "task": last.task,
        "seq": last.seq,
        "stage": last.stage,
        "generation": last.generation,
        "attempt_id": last.attempt_id,
        "created_at": last.created_at.isoformat(),
        "outputs": last.outputs,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(document, out)
    return str(path)


def agent_environment(
    base: dict[str, str],
    proxy_url: str,
    bundle: str,
    held: Held,
    checkpoint_file: str = "",
    *,
    java_trust_store: str = "",
    isolated: bool = False,
) -> dict[str, str]:
    """The child's environment: proxy with credentials, trust bundle, task identity, and
    where it resumes (its last checkpoint's stage and a file holding the checkpoint);
    plus the knobs of clients that do not read the usual variables (Node, Java)."""
    parts = urlsplit(proxy_url)
    userinfo = f"{quote(held.task, safe='')}:{quote(held.attempt_id, safe='')}"
    with_credentials = urlunsplit((parts.scheme, f"{userinfo}@{parts.netloc}", parts.path, "", ""))
    env = dict(base)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = with_credentials
    env.update(dict.fromkeys(TRUST_VARIABLES, bundle))
    # git's default proxy auth method ("anyauth") waits for a 407 challenge before it
    # sends credentials; the proxy never challenges, so have git send them up front.
    env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"
    # libpq clients (psql, psycopg, ...) send PGOPTIONS at start-up: the PostgreSQL relay
    # reads the attempt from it (and removes it) as the HTTP proxy reads its credentials.
    binding = f"-c sidecar.task={held.task} -c sidecar.attempt={held.attempt_id}"
    env["PGOPTIONS"] = f"{base['PGOPTIONS']} {binding}" if base.get("PGOPTIONS") else binding
    name, value = PG_CHANNEL_BINDING  # a SCRAM login over TLS through the relay needs it
    env.setdefault(name, value)
    # Node >= 24 (and 22.21) make fetch and https honour HTTP(S)_PROXY with this; older
    # Nodes ignore it (see docs/wiring.md): only --isolate catches their traffic.
    env["NODE_USE_ENV_PROXY"] = "1"
    java = java_options(parts.hostname or "127.0.0.1", parts.port or 80, java_trust_store, isolated)
    if java:
        env["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, [base.get("JAVA_TOOL_OPTIONS"), java]))
    env.update(
        SIDECAR_TASK=held.task,
        SIDECAR_ATTEMPT_ID=held.attempt_id,
        SIDECAR_GENERATION=str(held.generation),
        SIDECAR_LAST_STAGE=held.last_checkpoint.stage if held.last_checkpoint else "",
        SIDECAR_LAST_CHECKPOINT=checkpoint_file,
    )
    return env


def java_options(host: str, port: int, trust_store: str, isolated: bool) -> str:
    """``JAVA_TOOL_OPTIONS`` for a JVM agent: the trust store (Java reads no PEM bundle
    variable) and, without isolation, the proxy.

    Java's HttpClient and HttpURLConnection use ``http(s).proxyHost`` but never send
    proxy credentials unasked (only after a 407, and only to an Authenticator the program
    installs; Basic for CONNECT also needs ``jdk.http.auth.tunneling.disabledSchemes``
    emptied, done here). The sidecar does not challenge, so a non-isolated JVM reaches it
    unbound to the attempt. Isolated, the proxy properties are left out: the JVM
    connects directly, is redirected, and exec binds the connection itself.
    """
    options = []
    if not isolated:
        options += [
            f"-Dhttp.proxyHost={host}",
            f"-Dhttp.proxyPort={port}",
            f"-Dhttps.proxyHost={host}",
            f"-Dhttps.proxyPort={port}",
            "-Dhttp.nonProxyHosts=localhost|127.*|[::1]",
            "-Djdk.http.auth.tunneling.disabledSchemes=",
            "-Djdk.http.auth.proxying.disabledSchemes=",
        ]
    if trust_store:
        options += [
            f"-Djavax.net.ssl.trustStore={trust_store}",
            "-Djavax.net.ssl.trustStoreType=JKS",
            f"-Djavax.net.ssl.trustStorePassword={jks.PASSWORD}",
        ]
    return " ".join(options)


def exit_of(status: int) -> AgentExit:
    """How a child ended, from its ``returncode`` (negative: the signal that killed it)."""
    if status >= 0:
        return AgentExit(exit_code=status)
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"SIG{-status}"
    return AgentExit(signal=name)


def not_started(error: OSError) -> AgentExit:
    """Why a command could not be started, with the status a shell would exit with."""
    if isinstance(error, FileNotFoundError) or error.errno == errno.ENOENT:
        return AgentExit(exit_code=NOT_FOUND_EXIT, error="command not found")
    if isinstance(error, PermissionError):
        return AgentExit(exit_code=NOT_EXECUTABLE_EXIT, error="permission denied")
    return AgentExit(exit_code=NOT_EXECUTABLE_EXIT, error="cannot be started")


@dataclass(frozen=True)
class Isolation:
    """Whether to run the agent in a network namespace of its own (``sidecar.agent.isolation``):
    ``requested`` is True for ``--isolate`` (fail when impossible), False for
    ``--no-isolate``, None for the default (isolate where possible, else warn)."""

    requested: bool | None = None
    pg_relay: tuple[str, int] | None = None  # where the sidecar's PostgreSQL relay listens
    pg_ports: tuple[int, ...] = (5432,)  # destination ports redirected to it


def with_sidecars_relay(isolation: Isolation, info: dict[str, Any]) -> Isolation:
    """The relay the sidecar reports (``/v1/proxy``) where exec was told none: an
    isolated agent reaches it at the same address, and its server's port goes to it."""
    relay = info.get("pg_relay")
    if isolation.pg_relay is not None or not relay:
        return isolation
    host, _, port = str(relay).rpartition(":")
    ports = isolation.pg_ports
    upstream_port = info.get("pg_upstream_port")
    if isinstance(upstream_port, int) and upstream_port not in ports:
        ports = (*ports, upstream_port)
    return replace(isolation, pg_relay=(host.strip("[]"), int(port)), pg_ports=ports)


async def run(
    command: Sequence[str],
    *,
    control_url: str,
    token: str | None,
    task: str,
    worker: str,
    ttl_s: float,
    wait_s: float,
    notes: Notes | None = None,
    isolation: Isolation | None = None,
) -> int:
    notes = notes or Notes()
    isolation = isolation or Isolation(requested=False)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tls_roots.wait_for_roots()  # loading since exec imported aiohttp, done by now
    async with aiohttp.ClientSession(headers=headers) as session:
        info = await _proxy_info(session, control_url)
        isolation = with_sidecars_relay(isolation, info)
        # Before the claim: an impossible --isolate must not cost the task an attempt.
        space = _isolate(isolation, info["proxy_url"], control_url)
        try:
            keeper = LeaseKeeper(ControlLeases(session, control_url), task, worker, ttl_s)
            held = await keeper.acquire(wait_s, notes.waiting)
            notes.say(claim_line(held, worker))
            # Private (0700) and removed after: the checkpoint's outputs may be sensitive.
            # Those an exec killed before it could remove its own go first.
            private_dir.sweep()
            with private_dir.private_dir() as folder:
                checkpoint_file = write_last_checkpoint(folder, held.last_checkpoint)
                env = agent_environment(
                    dict(os.environ),
                    info["proxy_url"],
                    info["ca_bundle"],
                    held,
                    checkpoint_file,
                    java_trust_store=_java_trust_store(info["ca_bundle"], folder),
                    isolated=space is not None,
                )
                if space is None:
                    end, code = await _run_agent(command, env, keeper, held)
                else:
                    end, code = await _run_isolated(
                        command, env, keeper, held, space, info, isolation, folder
                    )
        finally:
            if space is not None:
                space.close()
        await keeper.release(end)
        if keeper.lost is not None:
            # The release was refused as stale: the lease went to another worker while the
            # agent ran, whatever the agent made of the refusals it met.
            end, code = replace(end, lease_lost=True), LEASE_LOST_EXIT
        await _summarise(notes, session, control_url, held, end)
        return code


def _isolate(isolation: Isolation, proxy_url: str, control_url: str) -> netns.Namespace | None:
    """The agent's namespace, or None: not asked, or (by default only) not possible here,
    said on stderr even with --quiet - the agent's traffic is then not contained."""
    if isolation.requested is False:
        return None
    reason = netns.unavailable()
    if reason is None:
        mirrors = [_loopback(proxy_url), _loopback(control_url)]
        if isolation.pg_relay is not None:
            mirrors.append(_loopback(f"tcp://{isolation.pg_relay[0]}:{isolation.pg_relay[1]}"))
        try:
            return netns.create(
                sorted({m for m in mirrors if m is not None}),
                pg=isolation.pg_relay is not None,
                dns=bool(resolv.nameservers(resolv.read(RESOLV_CONF))),
                pg_ports=isolation.pg_ports,
            )
        except netns.IsolationError as error:
            reason = str(error)
    if isolation.requested:
        raise ConfigError(f"--isolate is not possible here: {reason}; run with --no-isolate")
    print(
        f"{PREFIX}WARNING: the agent runs WITHOUT network isolation ({reason}): clients "
        "that ignore HTTP(S)_PROXY reach the network directly, bypassing the sidecar; "
        "give --no-isolate to accept that without this warning",
        file=sys.stderr,
        flush=True,
    )
    return None


def _loopback(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a URL on IPv4 loopback (mirrored into the namespace), else None."""
    parts = urlsplit(url)
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname or ""
    if not host.startswith("127.") or parts.port is None:
        return None
    return host, parts.port


def _java_trust_store(bundle: str, folder: Path) -> str:
    """A JKS trust store of the CA bundle in exec's private folder, or "" if unreadable."""
    try:
        return str(jks.write_trust_store(Path(bundle), folder / "trust-store.jks"))
    except (OSError, ValueError) as error:
        log.warning("no Java trust store: %s", error)
        return ""


def _namespace_files(folder: Path, routed: dict[str, str]) -> tuple[str, str, list[str]]:
    """The namespace's hosts and resolv.conf (``""`` when the host names no IPv4
    nameserver: then /etc/resolv.conf is left as it is), and the host's nameservers."""
    hosts = folder / "hosts"
    hosts.write_text(resolv.hosts_text(routed, resolv.read(HOSTS)))
    host_resolv = resolv.read(RESOLV_CONF)
    servers = resolv.nameservers(host_resolv)
    if not servers:
        return str(hosts), "", []
    resolv_file = folder / "resolv.conf"
    resolv_file.write_text(resolv.resolv_text(host_resolv))
    return str(hosts), str(resolv_file), servers


async def _run_isolated(
    command: Sequence[str],
    env: dict[str, str],
    keeper: LeaseKeeper,
    held: Held,
    space: netns.Namespace,
    info: dict[str, Any],
    isolation: Isolation,
    folder: Path,
) -> tuple[AgentExit, int]:
    """The agent in its namespace, with exec forwarding its sockets while it runs."""
    routed = resolv.routed_addresses(info.get("routes", []))
    hosts, resolv_file, servers = _namespace_files(folder, routed)
    proxy = urlsplit(info["proxy_url"])
    forwarder = Forwarder(
        space,
        proxy=(proxy.hostname or "127.0.0.1", proxy.port or 80),
        credentials=f"{quote(held.task, safe='')}:{quote(held.attempt_id, safe='')}",
        binding=(held.task, held.attempt_id),
        routed=routed,
        relay=isolation.pg_relay,
        nameserver=servers[0] if servers else None,
    )
    await forwarder.start()
    try:
        launch = space.argv(command, hosts, resolv_file)
        return await _run_agent(command, env, keeper, held, launch=launch, pass_fds=space.fds())
    finally:
        await forwarder.close()


async def _run_agent(
    command: Sequence[str],
    env: dict[str, str],
    keeper: LeaseKeeper,
    held: Held,
    *,
    launch: Sequence[str] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> tuple[AgentExit, int]:
    """Run the agent to its end (through ``launch`` when given: the command wrapped to
    start in its namespace); how it ended and the status to exit with."""
    task = held.task
    try:
        if launch is not None:
            _check_command(command[0], env)
        child = await asyncio.create_subprocess_exec(
            *(launch or command), env=env, pass_fds=pass_fds
        )
    except OSError as error:
        end = not_started(error)
        print(
            f"{PREFIX}{command[0]}: {end.error} ({error.strerror or error})",
            file=sys.stderr,
            flush=True,
        )
        assert end.exit_code is not None
        return end, end.exit_code
    log.info(
        "agent started",
        extra={
            "task": task,
            "attempt_id": held.attempt_id,
            "generation": held.generation,
            "pid": child.pid,
        },
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, _forward, child, sig)
    heartbeats = asyncio.create_task(keeper.keep(), name=f"heartbeat:{task}")
    exited = asyncio.create_task(child.wait(), name="agent")
    await asyncio.wait({heartbeats, exited}, return_when=asyncio.FIRST_COMPLETED)
    if not exited.done():
        # The heartbeat loop only ends when the lease was lost to another worker.
        log.error("stopping the agent: its lease was lost", extra={"task": task})
        await _stop(child)
        await exited
    heartbeats.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await heartbeats
    status = exited.result()
    end = exit_of(status)
    if keeper.lost is not None:
        return replace(end, lease_lost=True), LEASE_LOST_EXIT
    return end, 128 - status if status < 0 else status


def _check_command(name: str, env: dict[str, str]) -> None:
    """Raise what starting ``name`` directly would: the namespace's launcher starts fine
    whatever the command, and only a shell's 127 would say it was not found."""
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is not None:
        return
    if os.sep in name and os.path.exists(name):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _forward(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(sig)


async def _stop(child: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        await asyncio.wait_for(child.wait(), GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()


async def _proxy_info(session: aiohttp.ClientSession, control_url: str) -> dict[str, Any]:
    url = f"{control_url.rstrip('/')}/v1/proxy"
    try:
        async with session.get(url) as response:
            data: dict[str, Any] = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise SidecarUnreachable(
            f"no sidecar answers at {control_url} ({error}); start one with `sidecar serve`"
        ) from error
    if response.status != 200:
        raise SidecarError(f"{url}: {data.get('detail', response.status)}")
    return data


@dataclass
class AttemptEffects:
    """What one attempt did to the outside world, from the task's audit trail."""

    recorded: int = 0  # effects it recorded (and forwarded)
    replayed: int = 0  # answered from the log (replayed, or found by a probe)
    refused: int = 0  # writes refused: fenced, or a replay rejected for a payload change
    blocked: int = 0  # effects it touched that are left unknown (a probe or a human decides)
    problems: list[str] = field(default_factory=list)  # the refusals' problem texts
    partial: bool = False  # the log was longer than the summary reads

    def add_effects(self, effects: list[dict[str, Any]], attempt_id: str) -> None:
        """Count one page of ``GET /v1/tasks/{task}/effects``."""
        for effect in effects:
            mine = [e for e in effect.get("events", []) if e.get("attempt_id") == attempt_id]
            for event in mine:
                name, detail = event.get("event"), event.get("detail")
                if name in ("pending", "ran_again"):  # (ran_again: a SQL effect made again)
                    self.recorded += 1
                elif name in ("replayed", "probed"):
                    self.replayed += 1
                elif name == "divergent" and str(detail or "").startswith("rejected"):
                    self.refused += 1
                    self.problems.append(f"{effect.get('key')}: {detail}")
            if mine and effect.get("state") == "unknown":
                self.blocked += 1

    def add_refusals(self, refused_writes: list[dict[str, Any]], attempt_id: str) -> None:
        """Count the fenced writes of ``GET /v1/tasks/{task}``'s ``refused_writes``: the
        agent's (effects, checkpoints), not exec's own lease keeping - a lost lease says
        so in the end, and its refused heartbeat and release would only repeat it."""
        for refusal in refused_writes:
            if (
                refusal.get("attempt_id") == attempt_id
                and refusal.get("operation") not in LEASE_OPERATIONS
            ):
                self.refused += 1
                self.problems.append(f"{refusal.get('operation')}: {refusal.get('reason')}")

    def line(self) -> str:
        counts = (
            f"{self.recorded} recorded, {self.replayed} replayed, {self.refused} refused, "
            f"{self.blocked} blocked"
        )
        return counts + (" (of the first effects of a long log)" if self.partial else "")


def end_words(end: AgentExit) -> str:
    """How the agent ended, for the summary line."""
    if end.lease_lost:
        stopped = replace(end, lease_lost=False).describe()
        return f"lease lost (the agent was stopped: {stopped})"
    return end.describe()


async def read_attempt_effects(
    session: aiohttp.ClientSession, control_url: str, held: Held
) -> AttemptEffects:
    """Follow the task's effect log page by page (bounded) and count this attempt's part."""
    base = f"{control_url.rstrip('/')}/v1/tasks/{held.task}"
    tally = AttemptEffects()
    started = time.monotonic()
    cursor: str | None = None
    for page in range(SUMMARY_PAGES):
        params = {"limit": "500"} | ({"cursor": cursor} if cursor else {})
        data = await _get(session, f"{base}/effects", params)
        tally.add_effects(data.get("effects", []), held.attempt_id)
        cursor = data.get("next_cursor")
        if not cursor:
            break
        if page == SUMMARY_PAGES - 1 or time.monotonic() - started > SUMMARY_BUDGET_S:
            tally.partial = True
            break
    task = await _get(session, base, {})
    tally.add_refusals(task.get("refused_writes", []), held.attempt_id)
    return tally


async def _summarise(
    notes: Notes,
    session: aiohttp.ClientSession,
    control_url: str,
    held: Held,
    end: AgentExit,
) -> None:
    if notes.quiet:
        return
    head = f"attempt {held.attempt_id} of task {held.task} ended: {end_words(end)}"
    try:
        tally = await read_attempt_effects(session, control_url, held)
    except SidecarError as error:
        notes.say(f"{head}; its effects could not be read: {error.detail}")
        return
    notes.say(f"{head}; effects: {tally.line()}")
    for problem in tally.problems[:SHOWN_REFUSALS]:
        notes.say(f"refused: {problem}")
    if len(tally.problems) > SHOWN_REFUSALS:
        more = len(tally.problems) - SHOWN_REFUSALS
        notes.say(f"... and {more} more refusals: see `sidecar effects {held.task}`")


async def _get(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> dict[str, Any]:
    try:
        async with session.get(url, params=params) as response:
            data: dict[str, Any] = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise SidecarUnreachable(f"{url}: {error}") from error
    if response.status != 200:
        raise SidecarError(f"{url}: {data.get('detail', response.status)}")
    return data
