"""``sidecar webhook`` as a real process: TLS on a free port, a ready line, SIGTERM ends it."""

from __future__ import annotations

import base64
import json
import ssl
import sys
import urllib.request
from pathlib import Path

import jsonpatch

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
