"""Running mitmproxy inside the sidecar's process and event loop.

We build ``mitmproxy.master.Master`` ourselves, with mitmproxy's default addons and ours,
rather than ``DumpMaster`` (whose error check would exit the whole process on a start-up
error, taking the control API with it).  The Master must be created inside the running
loop; its ``run()`` installs an eager task factory on that loop while it runs.  Start-up
problems (a port in use, a bad option) are turned into :class:`ConfigError`.

Options that matter, and why:

* ``connection_strategy=lazy`` - connect upstream only when a request needs it: a
  routed host (``--route``) must never be dialled at its public address, and a
  recorded effect is forwarded by the sidecar's own client, not by mitmproxy;
* ``allow_hosts`` - TLS is only opened for hosts some effect rule or route could
  concern; every other connection is relayed as raw bytes, cheaper and kinder to
  certificate-pinned clients;
* ``confdir`` - the CA lives in the sidecar's data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from mitmproxy import certs, exceptions, options
from mitmproxy.addons import (
    block,
    core,
    disable_h2c,
    next_layer,
    proxyserver,
    strip_dns_https_records,
    tlsconfig,
    upstream_auth,
)
from mitmproxy.master import Master

from sidecar.errors import ConfigError
from sidecar.proxy import body_limit
from sidecar.proxy.dispatch import HookDispatch
from sidecar.proxy.routes import Routes
from sidecar.rules import RuleSet
from sidecar.runtime.aio import spawn

log = logging.getLogger("sidecar.proxy")

START_TIMEOUT_S = 20.0
#: How often :meth:`EmbeddedProxy.start` looks whether mitmproxy listens yet (it does
#: within a few milliseconds: a coarser step only adds to the sidecar's start-up).
_START_POLL_S = 0.002


def interception_hosts(rules: RuleSet, routes: Routes) -> list[str] | None:
    """``allow_hosts`` regexes (matched against ``host:port``), or None to open every TLS."""
    patterns: list[str] = []
    for rule in rules:
        if not rule.logged or rule.http is None:
            continue
        for host in rule.http.host:
            name, port = host.source.lower(), r"\d+"
            if re.fullmatch(r".+:\d+", name) and not name.endswith("]"):
                name, _, explicit = name.rpartition(":")
                port = explicit
            if name.strip("*") == "":
                return None
            glob = re.escape(name).replace(r"\*", ".*").replace(r"\?", ".")
            patterns.append(f"^{glob}:{port}$")
    patterns += [f"^{re.escape(host)}:\\d+$" for host in routes.hosts()]
    return sorted(set(patterns))


class EmbeddedProxy:
    def __init__(
        self,
        *,
        listen_host: str,
        listen_port: int,
        mode: str,
        confdir: Path,
        addons: Sequence[Any],
        allow_hosts: list[str] | None,
        upstream_ca: Path | None = None,
    ) -> None:
        self._settings: dict[str, Any] = {
            "listen_host": listen_host,
            "listen_port": listen_port,
            "mode": [mode],
            "confdir": str(confdir),
            "connection_strategy": "lazy",
            "allow_hosts": allow_hosts or [],
        }
        if upstream_ca is not None:
            self._settings["ssl_verify_upstream_trusted_ca"] = str(upstream_ca)
        self._addons = addons
        self._master: Master | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> list[tuple[str, int]]:
        """Start listening; return the bound addresses."""
        _check_bindable(self._settings["listen_host"], self._settings["listen_port"])
        opts = options.Options()
        body_limit.install()
        self._master = Master(opts)
        self._master.addons.add(*mitmproxy_addons())
        if self._addons:  # one entry of mitmproxy's chain for all of ours (proxy/dispatch.py)
            self._master.addons.add(HookDispatch(*self._addons))
        try:
            opts.update(**self._settings)
        except exceptions.OptionsError as error:
            raise ConfigError(f"proxy: {error}") from error
        self._task = spawn(self._master.run(), name="mitmproxy")
        proxyserver = self._master.addons.get("proxyserver")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not getattr(proxyserver, "is_running", False):
            if self._task.done() or loop.time() > deadline:
                await self.stop()
                raise ConfigError("the proxy did not start (see the log)")
            await asyncio.sleep(_START_POLL_S)
        addresses = [(str(a[0]), int(a[1])) for a in proxyserver.listen_addrs()]
        if not addresses:
            await self.stop()
            where = f"{self._settings['listen_host']}:{self._settings['listen_port']}"
            raise ConfigError(f"cannot listen on {where} for the proxy (see the log)")
        return addresses

    async def stop(self) -> None:
        if self._master is not None and self._task is not None:
            # Master.shutdown() leaves the listening sockets open (mitmdump relies on the
            # process exiting); an embedded proxy must close them itself.
            await self._master.addons.get("proxyserver").servers.update([])
            self._master.shutdown()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._master = None
        self._task = None


def mitmproxy_addons() -> list[Any]:
    """The part of mitmproxy's default addons a sidecar needs: options and commands, the
    proxy server and its layers, TLS, blocking non-local clients, h2c refused, upstream
    proxy credentials.  Interactive and rewriting features (onboarding app, playback,
    map/modify, sticky cookies, saving flows, anticache...) are left out: each one is a
    hook mitmproxy would call on every flow, and nothing of the sidecar uses them."""
    return [
        core.Core(),
        block.Block(),
        strip_dns_https_records.StripDnsHttpsRecords(),
        disable_h2c.DisableH2C(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        _TlsConfig(),
        upstream_auth.UpstreamAuth(),
    ]


def _check_bindable(host: str, port: int) -> None:
    """Refuse a taken port up front: mitmproxy reports it only in its log (and leaks the
    socket it tried with), and a clear error at start-up is what an operator needs."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(f"cannot listen on {host}:{port} for the proxy: {error}") from error


class _TlsConfig(tlsconfig.TlsConfig):
    """mitmproxy's TLS addon without its second load of the CA when the proxy starts
    (``running`` configures ``confdir`` again, a mitmproxy FIXME): the key was read by
    ``configure`` moments before, and reading it checks the RSA key, 40 ms each time."""

    def running(self) -> None:
        if getattr(self, "certstore", None) is None:
            super().running()

    def configure(self, updated: Any) -> None:
        with _ca_key_checked_already():
            super().configure(updated)


@contextlib.contextmanager
def _ca_key_checked_already() -> Iterator[None]:
    """While mitmproxy's TLS addon loads the CA from the confdir: without cryptography's
    consistency check of an RSA private key (p, q and d against n), 40 ms at every start.

    The sidecar's options give mitmproxy no key but the confdir's CA, which either
    mitmproxy generated there (``ensure_authority``) or the sidecar checked, with that
    check, before installing it (``--ca-from``: :func:`sidecar.proxy.ca.install_authority`
    loads it on every start); a passphrase-protected key takes mitmproxy's own path."""
    load = certs.load_pem_private_key

    def checked_already(data: bytes, password: bytes | None) -> Any:
        if password is not None:
            return load(data, password)
        return serialization.load_pem_private_key(data, None, unsafe_skip_rsa_key_validation=True)

    certs.load_pem_private_key = checked_already
    try:
        yield
    finally:
        certs.load_pem_private_key = load
