"""``sidecar serve``: assemble the sidecar and run it until signalled.

Start-up order is the safety argument: the rules are loaded and the store is open
(migrated, writable) before any listener exists, the CA and trust bundle are on disk
before the proxy accepts a connection, and the proxy's gate opens only once all of it is
in place - so no request is ever handled that could not be recorded.  The chosen
addresses are printed on one line, ``effect-sidecar ready control=... proxy=... ca=...
store=...``, so that scripts and tests can use ``:0`` ports.  The control API comes up
before the rest so that probes get an answer: ``/readyz`` says ``not_ready`` (and what it
waits for, :mod:`sidecar.serve.readiness`) until the gate is open, the PostgreSQL relay
listens and the ``--task`` lease is held.  The process stops on SIGTERM, SIGINT or
``POST /v1/shutdown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from sidecar.config import Settings, parse_listen
from sidecar.control.app import make_app
from sidecar.control.auth import is_loopback
from sidecar.control.keys import UPSTREAM, ProxyInfo
from sidecar.errors import ConfigError, SidecarError, StoreUnavailable
from sidecar.proxy.addons import (
    EffectAddon,
    ReadinessGate,
    Router,
    TaskBinder,
    TunnelCounter,
    UncoveredMode,
    UncoveredWrites,
)
from sidecar.proxy.ca import ensure_authority
from sidecar.proxy.embed import EmbeddedProxy, interception_hosts
from sidecar.proxy.guard import EffectGuard
from sidecar.proxy.routes import Routes
from sidecar.proxy.upstream import Upstream
from sidecar.proxy.upstream_trust import upstream_trust_file
from sidecar.recording.bindings import Bindings
from sidecar.rules import RuleSet, load_rules
from sidecar.rules.packs import default_rule_paths
from sidecar.runtime import startup, tls_roots
from sidecar.runtime.aio import spawn, stop_on_signals
from sidecar.runtime.clock import SystemClock
from sidecar.runtime.metrics import Metrics
from sidecar.serve.notify import Notifier
from sidecar.serve.readiness import Readiness
from sidecar.store import Store, create_store
from sidecar.store.base import CompositeObserver
from sidecar.store.observed import MetricsObserver

log = logging.getLogger("sidecar.server")

type Stop = Callable[[], Awaitable[None]]


@dataclass
class Running:
    """A started sidecar: what it listens on and how to stop it."""

    store: Store
    control_url: str
    proxy_url: str
    info: ProxyInfo
    rules: RuleSet
    _stops: list[Stop] = field(default_factory=list)
    pg_url: str = ""
    #: Set by ``POST /v1/shutdown``; :func:`serve` stops when it is.
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    readiness: Readiness = field(default_factory=Readiness)

    def ready_line(self, store_url: str) -> str:
        pg = f" pg={self.pg_url}" if self.pg_url else ""
        return (
            f"effect-sidecar ready control={self.control_url} proxy={self.proxy_url}{pg} "
            f"ca={self.info.ca_cert} store={store_url}"
        )

    async def stop(self) -> None:
        # Reverse order of start: listeners first, the store last.
        for stop in reversed(self._stops):
            with contextlib.suppress(Exception):
                await stop()
        self._stops.clear()


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _conditions(settings: Settings) -> Readiness:
    """What /readyz waits for, beyond the store: each part this configuration starts."""
    readiness = Readiness()
    readiness.require("proxy", "the proxy is starting")
    if settings.pg_upstream:
        readiness.require("pg_relay", "the PostgreSQL relay is starting")
    if settings.task:
        readiness.require("lease", f"the lease of task {settings.task} is not held yet")
    return readiness


async def _listen(runner: web.AppRunner, listen: str) -> str:
    """Serve the control app on ``listen``; its URL (with the port chosen for ``:0``)."""
    try:
        await web.TCPSite(runner, *parse_listen(listen)).start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc}") from exc
    return _url(*runner.addresses[0][:2])


def _refuse_an_unsafe_start(settings: Settings, control_host: str, token: str | None) -> None:
    """A control API beyond loopback with no token; a data dir that lost its store.

    A data dir that holds a CA was in use; if its default store is gone (a volume
    remounted empty, a file deleted), starting would begin an empty effect log and send
    every recorded effect again.  (The store's own marker covers stores made since the
    marker exists; this covers data dirs from before it.)"""
    if not is_loopback(control_host) and not token:
        raise ConfigError(
            f"the control API would listen on {control_host}, beyond loopback, without a "
            "token: give --control-token-file FILE (or SIDECAR_CONTROL_TOKEN)"
        )
    if settings.store is not None:
        return
    data_dir = settings.data_dir.expanduser()
    db = data_dir / "effects.db"
    present = db.is_file() and db.stat().st_size > 0
    if (data_dir / "ca").is_dir() and not present:
        raise StoreUnavailable(
            f"the data dir {data_dir} was in use (it holds a CA) but its store {db} is "
            "missing or empty: refusing to start with an empty effect log, which would send "
            "every recorded effect again. Restore the file, or give an empty --data-dir."
        )


def _warn_of_open_listeners(settings: Settings) -> None:
    """Say so when the proxy or the relay listens beyond loopback.

    Neither authenticates its clients: anyone who reaches the address can send effects
    in the name of the bound task (and use the proxy as an open one).  Some deployments
    mean it (an agent in another container of a compose file), so this warns, once per
    listener, instead of refusing."""
    listeners = [("proxy", "--proxy-listen", settings.proxy_listen)]
    if settings.pg_upstream:
        listeners.append(("PostgreSQL relay", "--pg-listen", settings.pg_listen))
    for what, flag, listen in listeners:
        host, _ = parse_listen(listen)
        if not is_loopback(host):
            log.warning(
                "the %s listens on %s, beyond loopback, and does not authenticate its "
                "clients: whoever reaches it acts as the agent (effects recorded in the "
                "task's name, the proxy usable by anyone); bind it to 127.0.0.1 (%s) "
                "unless the agent really is on another host, and then firewall it",
                what,
                listen,
                flag,
                extra={"listen": listen},
            )


async def _observe(
    store: Store, bindings: Bindings, metrics: Metrics, settings: Settings, stops: list[Stop]
) -> Notifier:
    """Count, log and announce every store write; the notifier the guard announces to."""
    notifier = Notifier(settings.notify, metrics, source=settings.worker)
    await notifier.start()
    stops.append(notifier.stop)
    store.observer = CompositeObserver(
        MetricsObserver(metrics, announce=notifier.announce), bindings
    )
    return notifier


def proxy_addons(
    settings: Settings,
    rules: RuleSet,
    routes: Routes,
    guard: EffectGuard,
    metrics: Metrics,
    gate: ReadinessGate,
) -> list[object]:
    """The proxy's addons, in the order mitmproxy runs them (one entry of its chain:
    ``proxy/dispatch.py``); ``bench/hooks.py`` times them on their own."""
    return [
        gate,
        TaskBinder(settings.task),
        EffectAddon(rules, guard, metrics),
        UncoveredWrites(UncoveredMode(settings.uncovered_writes), rules, metrics, guard.recorder),
        Router(routes),
        TunnelCounter(metrics),
    ]


async def start(settings: Settings) -> Running:
    # Before any connection: the roots loading since aiohttp's import (done by now).
    tls_roots.wait_for_roots()
    control_host, _ = parse_listen(settings.control_listen)
    proxy_host, proxy_port = parse_listen(settings.proxy_listen)
    token = settings.token()
    _refuse_an_unsafe_start(settings, control_host, token)
    _warn_of_open_listeners(settings)
    rules = load_rules(settings.rules or default_rule_paths())
    routes = Routes.parse(settings.route)
    clock = SystemClock()
    metrics = Metrics()
    store = create_store(settings.store_url)
    await store.open()
    stops: list[Stop] = [store.close]
    readiness = _conditions(settings)
    stop_requested = asyncio.Event()
    # What a release waits for besides the HTTP forwards: the relay's held-back writes.
    settlers: list[Callable[[], Awaitable[None]]] = []
    try:
        bindings = Bindings(store, clock, margin_s=settings.self_fence_margin_s)
        notifier = await _observe(store, bindings, metrics, settings, stops)
        authority = ensure_authority(
            settings.data_dir.expanduser(),
            settings.ca_from.expanduser() if settings.ca_from else None,
            settings.ca_bundle.expanduser() if settings.ca_bundle else None,
        )
        # Before any listener: a bad --upstream-ca is refused here, as a ConfigError.
        upstream = Upstream(routes, extra_ca=settings.upstream_ca)
        await upstream.start()
        stops.append(upstream.close)
        guard = EffectGuard(
            store,
            bindings,
            upstream,
            clock,
            metrics,
            store_retry_s=settings.store_retry_s,
            announce=notifier.announce,
        )
        gate = ReadinessGate()
        proxy = EmbeddedProxy(
            listen_host=proxy_host,
            listen_port=proxy_port,
            mode=settings.mode,
            confdir=authority.confdir,
            addons=proxy_addons(settings, rules, routes, guard, metrics, gate),
            allow_hosts=interception_hosts(rules, routes),
            upstream_ca=upstream_trust_file(authority.confdir, settings.upstream_ca),
        )
        bound = await proxy.start()
        stops.append(proxy.stop)
        proxy_url = _url(*bound[0])
        info = ProxyInfo(
            proxy_url=proxy_url,
            mode=settings.mode,
            ca_cert=str(authority.cert),
            ca_bundle=str(authority.bundle),
            rules=[rule.name for rule in rules],
            routes=routes.hosts(),
        )
        app = make_app(
            store,
            metrics=metrics,
            clock=clock,
            token=token,
            proxy=info,
            readiness=readiness,
            shutdown=stop_requested.set,
            rules=rules,
            before_release=lambda task, attempt_id: _settle_attempt(
                guard, settlers, task, attempt_id
            ),
        )
        runner = web.AppRunner(_probing_through(app, upstream), access_log=None)
        await runner.setup()
        stops.append(runner.cleanup)
        control_url = await _listen(runner, settings.control_listen)
        if settings.task:
            stops.append(await _hold_lease(settings, store, readiness, settlers, guard))
        pg_url = ""
        if settings.pg_upstream:
            # Only with a relay: it and its SQL parser cost start-up time and memory.
            # Started after the lease, so stopped before it is released: the statements
            # running then end (or are rolled back) while the attempt still holds it.
            from sidecar.pgwire import serving  # noqa: PLC0415

            pg_url = await serving.start_relay(
                settings, rules, bindings, store, metrics, authority, info, stops, settlers
            )
            readiness.met("pg_relay")
        gate.open()
        readiness.met("proxy")
    except BaseException:
        for stop in reversed(stops):
            with contextlib.suppress(Exception):
                await stop()
        raise
    log.info(
        "sidecar ready",
        extra={
            "control": control_url,
            "proxy": proxy_url,
            "rules": len(rules),
            "task": settings.task,
        },
    )
    return Running(
        store, control_url, proxy_url, info, rules, stops, pg_url, stop_requested, readiness
    )


def _probing_through(app: web.Application, upstream: Upstream) -> web.Application:
    """The control app with the proxy's upstream client: resume checks probe through it,
    with its routes, exactly as the proxy would."""
    app[UPSTREAM] = upstream
    return app


async def _settle_attempt(
    guard: EffectGuard,
    settlers: list[Callable[[], Awaitable[None]]],
    task: str,
    attempt_id: str,
) -> None:
    """Before an attempt's lease is released: its HTTP forwards in flight and the
    relay's held-back writes land (each bounded)."""
    await asyncio.gather(guard.settle_attempt(task, attempt_id), *(settle() for settle in settlers))


async def _hold_lease(
    settings: Settings,
    store: Store,
    readiness: Readiness,
    settlers: list[Callable[[], Awaitable[None]]],
    guard: EffectGuard,
) -> Stop:
    """Claim ``--task`` in the background (waiting out a live lease: the sidecar is not
    ready meanwhile), keep it; a fenced lease makes the sidecar not ready again."""
    assert settings.task is not None
    # Only with --task: a sidecar serving agents' leases does not hold one itself.
    from sidecar.agent.leasekeeper import LeaseKeeper, StoreLeases  # noqa: PLC0415

    keeper = LeaseKeeper(
        StoreLeases(store),
        settings.task,
        settings.worker,
        settings.lease_ttl_s,
        on_lost=lambda fenced: readiness.require("lease", f"lost: {fenced.detail}"),
    )

    async def hold() -> None:
        while True:
            try:
                await keeper.acquire(wait_s=float("inf"))
                break
            except SidecarError as error:  # the store is down: not a reason to give up
                readiness.require("lease", f"cannot claim task {keeper.task}: {error.detail}")
                log.warning("claiming the lease failed: %s", error.detail)
                await asyncio.sleep(1.0)
        readiness.met("lease")
        await keeper.keep()

    task = spawn(hold(), name=f"lease:{keeper.task}")

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if keeper.held is not None:  # what the attempt has in flight lands before it ends
            await _settle_attempt(guard, settlers, keeper.task, keeper.held.attempt_id)
        await keeper.release()

    return stop


async def serve(settings: Settings) -> None:
    running = await start(settings)
    print(running.ready_line((await running.store.info()).url), flush=True)
    startup.started()
    stop = running.stop_requested
    stop_on_signals(stop)
    try:
        await stop.wait()
    finally:
        log.info("sidecar stopping")
        await running.stop()
