"""The PostgreSQL relay as ``sidecar serve`` assembles it: one exactly-once engine per
connection when SQL rules are loaded, TLS toward agents with the sidecar's CA, and the
address ``/v1/proxy`` tells ``sidecar exec``.

``serve`` imports this module only when ``--pg-upstream`` is given: the relay and the SQL
parser it brings cost start-up time and memory a sidecar without one never pays.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from sidecar.config import Settings, parse_listen
from sidecar.control.keys import ProxyInfo
from sidecar.pgwire.exactly_once import PgEffects
from sidecar.pgwire.mirror import Mirrors
from sidecar.pgwire.relay import Relay, Upstream
from sidecar.pgwire.session import Link, run_session
from sidecar.pgwire.tls import RelayCertificates
from sidecar.proxy.ca import Authority
from sidecar.recording.bindings import Bindings, BindRequest
from sidecar.rules import RuleSet
from sidecar.runtime.metrics import Metrics
from sidecar.store import Store

type Step = Callable[[], Awaitable[None]]


async def start_relay(
    settings: Settings,
    rules: RuleSet,
    bindings: Bindings,
    store: Store,
    metrics: Metrics,
    authority: Authority,
    info: ProxyInfo,
    stops: list[Step],
    settlers: list[Step],
) -> str:
    """Listen; add its stop to ``stops`` and what a release waits for (its held-back
    writes) to ``settlers``; tell ``/v1/proxy`` where. The relay's URL."""
    assert settings.pg_upstream is not None
    mirrors = Mirrors()
    settlers.append(mirrors.settle)
    relay = pg_relay(
        settings, rules, bindings, store, metrics, mirrors,
        RelayCertificates.from_confdir(authority.confdir, authority.cert),
    )  # fmt: skip
    host, port = await relay.start(*parse_listen(settings.pg_listen))
    stops.append(relay.stop)
    info.pg_relay.append((f"{host}:{port}", urlsplit(settings.pg_upstream).port))
    return f"postgresql://{host}:{port}"


def pg_relay(
    settings: Settings,
    rules: RuleSet,
    bindings: Bindings,
    store: Store,
    metrics: Metrics,
    mirrors: Mirrors,
    certificates: RelayCertificates | None = None,
) -> Relay:
    """The PostgreSQL relay; with SQL rules, each connection gets an exactly-once engine."""
    effects = (
        PgEffects(
            rules, bindings, store, metrics, mirrors=mirrors, store_retry_s=settings.store_retry_s
        )
        if rules.has_sql
        else None
    )
    assert settings.pg_upstream is not None

    async def session(link: Link, bind: BindRequest, parameters: dict[str, str]) -> None:
        database = parameters.get("database") or parameters.get("user", "")
        if bind.task is None and settings.task:
            # As for HTTP: a connection that names no task acts for the sidecar's own
            # (the Kubernetes shape, where a redirected agent sets no PGOPTIONS).
            bind = BindRequest(settings.task, None, "pg")
        engine = effects.engine(bind, database) if effects is not None else None
        await run_session(link, engine)

    # Agents asking for TLS get a certificate of the sidecar's CA (the bundle trusts it).
    upstream = Upstream.parse(settings.pg_upstream, settings.pg_upstream_ca)
    relay = Relay(upstream, session, certificates=certificates)
    bindings.when_fenced(relay.close_attempt)
    return relay
