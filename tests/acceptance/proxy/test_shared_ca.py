"""``sidecar serve --ca-from DIR``: a real sidecar intercepts HTTPS with the CA it was given
(a Kubernetes TLS Secret's layout), so a client trusting only that CA gets through."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.support.certs import make_ca, write_ca
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

URL = "https://api.things.test/repos/acme/app/things"


def read_only(directory: Path) -> None:
    for path in directory.iterdir():
        path.chmod(0o444)
    directory.chmod(0o555)


def test_serve_intercepts_with_the_ca_from_the_directory(make_stack, tmp_path):
    secret = tmp_path / "secret"
    cert, _ = write_ca(secret, *make_ca("team CA"))
    read_only(secret)
    stack: Stack = make_stack(sidecar_args=["--ca-from", str(secret)])
    proxies = {"https": stack.proxy_url}
    # The client trusts the test CA's own file and nothing else.
    answer = requests.get(URL, proxies=proxies, verify=str(cert), timeout=30)
    assert answer.status_code == 200
    assert answer.headers["X-Sidecar-Effect"] == "passthrough"
    info = stack._get(f"{stack.control_url}/v1/proxy")
    assert info["ca_cert"] == stack.ca_cert
    assert Path(info["ca_cert"]).read_bytes() == cert.read_bytes()
    assert cert.read_bytes() in Path(info["ca_bundle"]).read_bytes()
    assert sorted(p.name for p in secret.iterdir()) == ["tls.crt", "tls.key"]


def test_a_restart_with_another_ca_uses_that_one(make_stack, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first_cert, _ = write_ca(first, *make_ca("first CA"))
    second_cert, _ = write_ca(second, *make_ca("second CA"))
    stack: Stack = make_stack(sidecar_args=["--ca-from", str(first)])
    proxies = {"https": stack.proxy_url}
    assert requests.get(URL, proxies=proxies, verify=str(first_cert), timeout=30).ok
    stack.sidecar_args = ["--ca-from", str(second)]
    stack.start_sidecar()
    assert requests.get(URL, proxies=proxies, verify=str(second_cert), timeout=30).ok
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(URL, proxies=proxies, verify=str(first_cert), timeout=30)
    assert Path(stack.ca_cert).read_bytes() == second_cert.read_bytes()
