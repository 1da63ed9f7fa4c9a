"""The webhook over real TLS: the aiohttp server, a client that verifies its certificate,
AdmissionReview round trips, the patch applied and the pod validated."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import jsonpatch
import pytest

from sidecar.errors import ConfigError
from sidecar.kube.config import InjectConfig
from sidecar.kube.inject import JOB_END_WARNING
from sidecar.kube.webhook import start
from sidecar.testing.served import stop_runner
from tests.support import certs
from tests.unit.kube.manifests import (
    AGENT_POD,
    FALLBACK_VERSIONS,
    INDEXED_JOB,
    NATIVE_VERSIONS,
    assert_valid,
    job_pod,
    load,
    resolved_env,
)
from tests.unit.kube.test_webhook import admission


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 that the test client trusts as its own CA."""
    return certs.write_ca(directory, *certs.make_ca("effect-sidecar-webhook", ip="127.0.0.1"))


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path)


@pytest.fixture
async def webhook(tls: tuple[Path, Path]) -> AsyncIterator[str]:
    runner, url = await start("127.0.0.1:0", *tls, InjectConfig())
    try:
        yield url
    finally:
        await stop_runner(runner)


@pytest.fixture
async def client(tls: tuple[Path, Path]) -> AsyncIterator[aiohttp.ClientSession]:
    context = ssl.create_default_context(cafile=str(tls[0]))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield session


async def test_a_pod_create_round_trips_into_a_valid_injected_pod(webhook, client):
    pod = load(AGENT_POD)
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        assert answer.status == 200
        body = await answer.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    response = body["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == (
        "705ab4f5-6393-11e8-b7cc-42010a800002",
        True,
        "JSONPatch",
    )
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    assert_valid(patched, NATIVE_VERSIONS)
    names = [c["name"] for c in patched["spec"]["initContainers"]]
    assert names == ["effect-sidecar-redirect", "effect-sidecar"]


async def test_reinvoking_on_the_injected_pod_adds_nothing(webhook, client):
    pod = load(AGENT_POD)
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        first = (await answer.json())["response"]
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(first["patch"])))
    async with client.post(f"{webhook}/mutate", json=admission(patched)) as answer:
        again = (await answer.json())["response"]
    assert again == {"uid": first["uid"], "allowed": True}


async def test_the_fallback_shape_round_trips_too(webhook, client):
    pod = load(AGENT_POD)
    pod["metadata"]["annotations"]["effect-sidecar.io/native-sidecar"] = "false"
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        response = (await answer.json())["response"]
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    assert_valid(patched, FALLBACK_VERSIONS)
    assert patched["spec"]["containers"][0]["name"] == "effect-sidecar"
    assert JOB_END_WARNING not in response.get("warnings", []), "not a Job's pod: nothing to end"


async def test_a_job_pod_in_the_fallback_shape_comes_back_with_a_warning(webhook, client):
    pod = load(AGENT_POD)
    pod["metadata"]["annotations"]["effect-sidecar.io/native-sidecar"] = "false"
    pod["metadata"]["labels"] = {"job-name": "agent-312", "effect-sidecar.io/inject": "true"}
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        response = (await answer.json())["response"]
    assert response["allowed"] is True
    assert JOB_END_WARNING in response["warnings"]


async def test_a_bad_annotation_is_refused_with_its_name(webhook, client):
    pod = load(AGENT_POD)
    pod["metadata"]["annotations"]["effect-sidecar.io/include-outbound-cidrs"] = "10.0.0/8"
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        assert answer.status == 200
        response = (await answer.json())["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    message = response["status"]["message"]
    assert "effect-sidecar.io/include-outbound-cidrs: '10.0.0/8' is not a CIDR" in message


async def test_a_body_that_is_not_a_review_is_a_400(webhook, client):
    async with client.post(f"{webhook}/mutate", data=b"{not json") as answer:
        assert answer.status == 400
    async with client.post(f"{webhook}/mutate", json={"kind": "Pod"}) as answer:
        assert answer.status == 400


async def problem_of(answer: aiohttp.ClientResponse) -> dict:
    assert answer.status == 400
    assert answer.content_type == "application/problem+json"
    problem = json.loads(await answer.read())
    assert (problem["status"], problem["code"]) == (400, "invalid_request")
    return problem


async def test_json_nested_100k_deep_is_a_400_problem_not_a_crash(webhook, client):
    deep = b"[" * 100_000 + b"]" * 100_000
    async with client.post(f"{webhook}/mutate", data=deep) as answer:
        problem = await problem_of(answer)
    assert "nested too deeply" in problem["detail"]
    # and the webhook still serves
    async with client.post(f"{webhook}/mutate", json=admission(load(AGENT_POD))) as answer:
        assert (await answer.json())["response"]["allowed"] is True


async def test_a_pod_nested_deeper_than_any_pod_is_denied(webhook, client):
    pod = load(AGENT_POD)
    value: object = "x"
    for _ in range(900):  # parses, but would exhaust the stack of the injection
        value = [value]
    pod["spec"]["containers"][0]["args"] = [value]
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        assert answer.status == 200
        response = (await answer.json())["response"]
    assert response["allowed"] is False
    assert "nested more than 100 levels deep" in response["status"]["message"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b["request"].update(kind="Pod"), "request.kind: expected an object"),
        (lambda b: b.update(request=[]), "request: expected an object"),
        (lambda b: b["request"].pop("uid"), "request.uid"),
    ],
)
async def test_a_malformed_admission_review_is_a_400_problem_naming_it(
    webhook, client, change, message
):
    body = admission(load(AGENT_POD))
    change(body)
    async with client.post(f"{webhook}/mutate", json=body) as answer:
        problem = await problem_of(answer)
    assert message in problem["detail"]
    assert problem["instance"] == "/mutate"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda pod: pod["spec"].update(containers={"agent": {"image": "x"}}),
         "spec.containers: expected a list, got an object"),
        (lambda pod: pod["spec"]["containers"].insert(0, None),
         "spec.containers[0]: expected an object (a container), got null"),
        (lambda pod: pod["spec"]["containers"][0].update(env="SSL_CERT_FILE=/x"),
         "spec.containers[0].env: expected a list, got a string"),
    ],
)  # fmt: skip
async def test_a_nonsense_pod_is_denied_with_a_message_naming_the_field(
    webhook, client, change, message
):
    pod = load(AGENT_POD)
    change(pod)
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        assert answer.status == 200
        response = (await answer.json())["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]


async def test_a_host_network_pod_is_denied_naming_the_opt_out(webhook, client):
    pod = load(AGENT_POD)
    pod["spec"]["hostNetwork"] = True
    async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
        response = (await answer.json())["response"]
    assert response["allowed"] is False
    assert 'effect-sidecar.io/allow-host-network: "true"' in response["status"]["message"]


async def test_each_pod_of_an_indexed_job_is_patched_with_its_own_task(webhook, client):
    tasks = []
    for index in range(5):
        pod = job_pod(load(INDEXED_JOB), index)
        async with client.post(f"{webhook}/mutate", json=admission(pod)) as answer:
            response = (await answer.json())["response"]
        patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        assert_valid(patched, NATIVE_VERSIONS)
        tasks.append(resolved_env(patched, "effect-sidecar")["SIDECAR_TASK"])
    assert tasks == [f"indexed-job-{index}" for index in range(5)]


async def test_a_kept_ca_variable_is_a_warning_in_the_review(webhook, client):
    async with client.post(f"{webhook}/mutate", json=admission(load(AGENT_POD))) as answer:
        response = (await answer.json())["response"]
    assert response["patchType"] == "JSONPatch"
    assert [w for w in response["warnings"] if "REQUESTS_CA_BUNDLE" in w and "'agent'" in w]


async def test_healthz_answers_over_tls(webhook, client):
    async with client.get(f"{webhook}/healthz") as answer:
        assert (answer.status, await answer.json()) == (200, {"status": "ok"})


async def test_a_plain_http_client_gets_no_answer(webhook):
    plain = webhook.replace("https://", "http://")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"{plain}/healthz") as answer:
                await answer.read()


async def test_an_unreadable_certificate_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot load TLS certificate"):
        await start("127.0.0.1:0", tmp_path / "no.crt", tmp_path / "no.key", InjectConfig())
