"""An HTTPS upstream is checked against the same CAs whichever connection reaches it:
the sidecar's own client (a recorded effect) and mitmproxy's (a request no rule records,
streamed through). Both trust the system's roots - loaded while the sidecar starts,
``sidecar.runtime.tls_roots`` - and ``--upstream-ca`` on top of them, not instead.

The "system" is ``SSL_CERT_FILE``, which OpenSSL reads in place of the machine's bundle:
the upstream is the GitHub emulator over HTTPS, with a certificate for 127.0.0.1 signed
by a test CA, and the sidecar routes api.github.com to it. An upstream nothing trusted
signed gets nothing: the effect is refused unsent, the read fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from sidecar.testing.sidecar import SidecarProcess
from tests.integration.emulators import TOKEN, Emulator, running_github_tls
from tests.support import certs

RULES = """\
version: 1
rules:
  - name: test.repos.create
    description: Creating a repository, once per name.
    match: {host: api.github.com, method: POST, path: /user/repos}
    effect: non_idempotent
    key: "repo:{body.name}"
"""


@pytest.fixture(scope="module")
def trusted_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The CA file the emulator's certificate chains to, and that certificate and key."""
    folder = tmp_path_factory.mktemp("tls")
    return certs.write_serving_chain(folder, "github emulator", dns=["api.github.com"])


@pytest.fixture(scope="module")
def emulator(
    tmp_path_factory: pytest.TempPathFactory, trusted_ca: tuple[Path, Path, Path]
) -> Iterator[Emulator]:
    with running_github_tls(tmp_path_factory.mktemp("github") / "data", trusted_ca) as up:
        yield up


@dataclass(frozen=True)
class Trust:
    """Whose CA signs what the sidecar is given to trust: the system's (``SSL_CERT_FILE``)
    and ``--upstream-ca``'s; "ours" is the CA that signed the upstream's certificate."""

    system: str
    extra: str | None
    trusted: bool


TRUSTS = {
    "system-roots-sign-it": Trust("ours", None, trusted=True),
    "nothing-signs-it": Trust("other", None, trusted=False),
    "upstream-ca-adds-to-the-system-roots": Trust("ours", "other", trusted=True),
    "upstream-ca-signs-it": Trust("other", "ours", trusted=True),
}


def through_the_proxy(sidecar: SidecarProcess, method: str, path: str, **kw: Any) -> Any:
    """A request to api.github.com through the proxy, over CONNECT, as agents make them."""
    return requests.request(
        method,
        f"https://api.github.com{path}",
        headers=TOKEN | {"X-Sidecar-Task": "t-trust"},
        proxies={"https": sidecar.proxy},
        verify=sidecar.ca_cert,
        timeout=30,
        **kw,
    )


@pytest.mark.parametrize("trust", TRUSTS.values(), ids=TRUSTS.keys())
def test_an_https_upstream_is_trusted_by_the_same_cas_on_every_path(
    tmp_path: Path, emulator: Emulator, trusted_ca: tuple[Path, Path, Path], trust: Trust
) -> None:
    ours, _, _ = trusted_ca
    other, _ = certs.write_ca(tmp_path / "other-ca")
    ca = {"ours": ours, "other": other}
    name = f"repo-{tmp_path.name}"
    logs = tmp_path / "logs"
    logs.mkdir()
    rules = tmp_path / "repos.yaml"
    rules.write_text(RULES)
    sidecar = SidecarProcess(
        tmp_path / "data",
        logs,
        rules=[rules],
        routes=[f"api.github.com={emulator.url}"],
        args=["--upstream-ca", str(ca[trust.extra])] if trust.extra else [],
    )
    sidecar.start({"SSL_CERT_FILE": str(ca[trust.system])})
    try:
        sidecar.post("/v1/tasks/t-trust/claim", {"worker": "w", "ttl_s": 60})
        # Recorded: forwarded by the sidecar's own client.
        created = through_the_proxy(sidecar, "POST", "/user/repos", json={"name": name})
        # Read: no rule records it, mitmproxy streams it over a connection of its own.
        read = through_the_proxy(sidecar, "GET", f"/repos/agent/{name}")
        (effect,) = sidecar.get("/v1/tasks/t-trust/effects")["effects"]
    finally:
        sidecar.terminate()
    there = requests.get(
        f"{emulator.url}/repos/agent/{name}", headers=TOKEN, verify=str(ours), timeout=10
    )
    if trust.trusted:
        assert (created.status_code, created.headers["X-Sidecar-Effect"]) == (201, "recorded")
        assert effect["state"] == "completed"
        assert (read.status_code, read.headers["X-Sidecar-Effect"]) == (200, "passthrough")
        assert read.json()["full_name"] == f"agent/{name}"
        assert there.status_code == 200
    else:
        assert created.status_code == 502, created.text
        assert "CERTIFICATE_VERIFY_FAILED" in created.json()["detail"]
        assert effect["state"] == "failed"
        assert read.status_code == 502, read.text
        assert there.status_code == 404  # the emulator never saw it
