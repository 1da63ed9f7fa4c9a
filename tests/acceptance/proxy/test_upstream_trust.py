"""The sidecar checks an HTTPS upstream against the system's trusted roots, which it
loads while it starts (``sidecar.runtime.tls_roots``): a recorded effect reaches an
upstream whose certificate a root of the system signed, and is refused, unsent, by one
that no root signed.

The "system" is ``SSL_CERT_FILE``, which OpenSSL reads in place of the machine's bundle:
the upstream is the GitHub emulator over HTTPS, with a certificate for 127.0.0.1 signed
by a test CA, and the sidecar routes api.github.com to it with no ``--upstream-ca``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sidecar.testing.sidecar import SidecarProcess
from tests.integration.emulators import TOKEN, Emulator, running_github
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
    ca_cert, ca_key = certs.make_ca()
    ca_file, _ = certs.write_ca(folder / "ca", ca_cert, ca_key)
    cert, key = certs.issue(ca_cert, ca_key, "github emulator", dns=["api.github.com"])
    cert_file, key_file = certs.write_ca(folder / "server", cert, key)
    return ca_file, cert_file, key_file


@pytest.fixture(scope="module")
def emulator(
    tmp_path_factory: pytest.TempPathFactory, trusted_ca: tuple[Path, Path, Path]
) -> Iterator[Emulator]:
    _, cert_file, key_file = trusted_ca
    data = tmp_path_factory.mktemp("github") / "data"
    with running_github(data, "--tls-cert", str(cert_file), "--tls-key", str(key_file)) as up:
        yield up


def create_repo_through(sidecar: SidecarProcess, task: str, name: str) -> requests.Response:
    claim = sidecar.post(f"/v1/tasks/{task}/claim", {"worker": "w", "ttl_s": 60})
    assert claim["generation"] == 1
    # Over plain HTTP to the proxy: the sidecar's own client is the only one that meets
    # the upstream (mitmproxy would otherwise open a connection of its own for the
    # CONNECT, checked against its own trust store).
    return requests.post(
        "http://api.github.com/user/repos",
        json={"name": name},
        headers=TOKEN | {"X-Sidecar-Task": task},
        proxies={"http": sidecar.proxy},
        timeout=30,
    )


@pytest.mark.parametrize("trusted", [True, False], ids=["signed-by-a-root", "signed-by-none"])
def test_an_https_upstream_is_checked_against_the_system_roots(
    tmp_path: Path, emulator: Emulator, trusted_ca: tuple[Path, Path, Path], trusted: bool
) -> None:
    ca_file, _, _ = trusted_ca
    name = f"checked-{'trusted' if trusted else 'untrusted'}"
    roots = ca_file
    if not trusted:
        other, _ = certs.write_ca(tmp_path / "other-ca")
        roots = other
    logs = tmp_path / "logs"
    logs.mkdir()
    rules = tmp_path / "repos.yaml"
    rules.write_text(RULES)
    sidecar = SidecarProcess(
        tmp_path / "data",
        logs,
        rules=[rules],
        routes=[f"api.github.com={emulator.url}"],
    )
    sidecar.start({"SSL_CERT_FILE": str(roots)})
    try:
        answer = create_repo_through(sidecar, "t-trust", name)
        (effect,) = sidecar.get("/v1/tasks/t-trust/effects")["effects"]
    finally:
        sidecar.terminate()
    listed = requests.get(
        f"{emulator.url}/repos/agent/{name}", headers=TOKEN, verify=str(ca_file), timeout=10
    )
    if trusted:
        assert (answer.status_code, answer.headers["X-Sidecar-Effect"]) == (201, "recorded")
        assert answer.json()["full_name"] == f"agent/{name}"
        assert effect["state"] == "completed"
        assert listed.status_code == 200
    else:
        assert answer.status_code == 502, answer.text
        assert "CERTIFICATE_VERIFY_FAILED" in answer.json()["detail"]
        assert effect["state"] == "failed"
        assert listed.status_code == 404  # the emulator never saw it
