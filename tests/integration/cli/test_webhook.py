"""``sidecar webhook`` as a real process: TLS on a free port, a ready line, SIGTERM ends it,
and a certificate replaced on disk is served without a restart."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import jsonpatch
import pytest
from cryptography import x509

from sidecar.testing.processes import Child
from tests.integration.kube.test_webhook import self_signed
from tests.unit.kube.manifests import AGENT_POD, load
from tests.unit.kube.test_webhook import admission

# Until the verb is registered in sidecar.cli, the process builds the same parser itself.
ENTRY = (
    "import argparse, sys\n"
    "from sidecar.cli import webhook\n"
    "parser = argparse.ArgumentParser(prog='sidecar')\n"
    "webhook.register(parser.add_subparsers(dest='verb', required=True))\n"
    "args = parser.parse_args(sys.argv[1:])\n"
    "sys.exit(args.run(args))\n"
)


def test_the_webhook_process_answers_a_review_over_tls_and_stops_on_sigterm(tmp_path: Path):
    cert, key = self_signed(tmp_path)
    config = tmp_path / "inject.yaml"
    config.write_text("image: registry.acme/effect-sidecar:test\n")
    argv = [sys.executable, "-c", ENTRY, "webhook", "--listen", "127.0.0.1:0"]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--config", str(config)]
    with Child(argv, stderr_path=tmp_path / "webhook.log") as child:
        url = child.wait_for(r"effect-sidecar webhook ready (\S+)", timeout=30).group(1)
        context = ssl.create_default_context(cafile=str(cert))
        request = urllib.request.Request(
            f"{url}/mutate",
            data=json.dumps(admission(load(AGENT_POD))).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            response = json.loads(answer.read())["response"]
        assert (response["allowed"], response["patchType"]) == (True, "JSONPatch")
        patch = json.loads(base64.b64decode(response["patch"]))
        pod = jsonpatch.apply_patch(load(AGENT_POD), patch)
        images = {c["image"] for c in pod["spec"]["initContainers"]}
        assert images == {"registry.acme/effect-sidecar:test"}  # the --config file was read
        assert child.terminate(timeout=10) == 0


def served_serial(url: str, context: ssl.SSLContext) -> int:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    with (
        socket.create_connection((parts.hostname, parts.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=parts.hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_the_webhook_process_serves_a_renewed_certificate_without_a_restart(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert, key = self_signed(tmp_path / "a")
    new_cert, new_key = self_signed(tmp_path / "b")
    serial = {
        path: x509.load_pem_x509_certificate(path.read_bytes()).serial_number
        for path in (cert, new_cert)
    }
    context = ssl.create_default_context(cafile=str(cert))
    context.load_verify_locations(cafile=str(new_cert))  # the client trusts both
    argv = [sys.executable, "-c", ENTRY, "webhook", "--listen", "127.0.0.1:0"]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key), "--reload-s", "0.1"]
    with Child(argv, stderr_path=tmp_path / "webhook.log") as child:
        url = child.wait_for(r"effect-sidecar webhook ready (\S+)", timeout=30).group(1)
        assert served_serial(url, context) == serial[cert]
        shutil.copyfile(new_key, key)  # key first: in between, the pair does not match
        shutil.copyfile(new_cert, cert)
        deadline = time.monotonic() + 15
        while (seen := served_serial(url, context)) != serial[new_cert]:
            if time.monotonic() > deadline:
                pytest.fail(f"still serving serial {seen} after the files were replaced")
            time.sleep(0.05)
        assert child.terminate(timeout=10) == 0
    assert "TLS certificate reloaded" in (tmp_path / "webhook.log").read_text()
