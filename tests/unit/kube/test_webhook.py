"""The admission decision: AdmissionReview v1 in, AdmissionReview v1 out."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from sidecar.kube.config import InjectConfig
from sidecar.kube.webhook import BadReview, review
from tests.unit.kube.manifests import (
    AGENT_POD,
    INDEXED_JOB,
    NATIVE_VERSIONS,
    PARALLEL_JOB,
    assert_valid,
    job_pod,
    load,
    resolved_env,
)

CONFIG = InjectConfig()


def admission(pod: dict, *, operation: str = "CREATE", kind: str = "Pod") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "agents",
            "operation": operation,
            "object": pod,
        },
    }


def test_an_opted_in_pod_gets_a_json_patch_that_injects_it():
    pod = load(AGENT_POD)
    answer = review(admission(pod), CONFIG)
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    patched = jsonpatch.apply_patch(pod, patch)
    assert_valid(patched, NATIVE_VERSIONS)
    assert "effect-sidecar.io/status" in patched["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("pod", "operation", "kind"),
    [
        ({"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "a"}]}}, "CREATE",
         "Pod"),
        (None, "UPDATE", "Pod"),
        (None, "CREATE", "Deployment"),
    ],
)  # fmt: skip
def test_anything_else_is_allowed_without_a_patch(pod, operation, kind):
    body = admission(pod or load(AGENT_POD), operation=operation, kind=kind)
    response = review(body, CONFIG)["response"]
    assert response == {"uid": body["request"]["uid"], "allowed": True}


def test_a_pod_in_a_skipped_namespace_is_allowed_without_a_patch():
    body = admission(load(AGENT_POD))
    body["request"]["namespace"] = "kube-system"
    assert "patch" not in review(body, CONFIG)["response"]


def test_a_bad_annotation_refuses_the_pod_with_400_naming_it():
    pod = load(AGENT_POD)
    pod["metadata"]["annotations"]["effect-sidecar.io/exclude-outbound-ports"] = "99999"
    response = review(admission(pod), CONFIG)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert (
        "effect-sidecar.io/exclude-outbound-ports: '99999' is not a port"
        in (response["status"]["message"])
    )
    assert "patch" not in response


@pytest.mark.parametrize(
    "body",
    [[], {"apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}},
     {"apiVersion": "admission.k8s.io/v1"}],
)  # fmt: skip
def test_a_body_that_is_not_an_admission_review_v1_is_rejected(body):
    with pytest.raises(BadReview):
        review(body, CONFIG)


# --- malformed reviews: a bad request; a well-formed review of a nonsense pod: a denial ------


def review_with(change) -> dict:
    body = admission(load(AGENT_POD))
    change(body)
    return body


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b["request"].update(kind="Pod"), "request.kind: expected an object"),
        (lambda b: b["request"].update(kind={"group": "", "kind": 7}),
         "request.kind.kind: expected a string"),
        (lambda b: b["request"].update(operation=["CREATE"]),
         "request.operation: expected a string"),
        (lambda b: b["request"].update(namespace={"name": "agents"}),
         "request.namespace: expected a string"),
        (lambda b: b["request"].update(uid=""), "request.uid"),
        (lambda b: b.update(kind="Pod"), "expected an AdmissionReview"),
    ],
)  # fmt: skip
def test_a_malformed_admission_review_is_a_bad_request_naming_what_is_wrong(change, message):
    with pytest.raises(BadReview) as caught:
        review(review_with(change), CONFIG)
    assert message in caught.value.detail


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda pod: pod["spec"].update(containers={"agent": {}}),
         "spec.containers: expected a list, got an object"),
        (lambda pod: pod["spec"].update(containers=[None]),
         "spec.containers[0]: expected an object (a container), got null"),
        (lambda pod: pod["spec"]["containers"][0].update(env="A=b"),
         "spec.containers[0].env: expected a list, got a string"),
        (lambda pod: pod.update(metadata="coding-agent"),
         "metadata: expected an object, got a string"),
    ],
)  # fmt: skip
def test_a_well_formed_review_of_a_nonsense_pod_is_denied_naming_the_field(change, message):
    body = review_with(lambda b: change(b["request"]["object"]))
    response = review(body, CONFIG)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert message in response["status"]["message"]
    assert response["status"]["message"].startswith("effect-sidecar: ")
    assert "patch" not in response


def test_a_review_of_a_pod_that_is_not_an_object_is_denied():
    body = review_with(lambda b: b["request"].update(object=["not", "a", "pod"]))
    response = review(body, CONFIG)["response"]
    assert response["allowed"] is False
    assert (
        "request.object: expected an object (a Pod), got a list" in (response["status"]["message"])
    )


# --- hostNetwork --------------------------------------------------------------------------


def test_a_host_network_pod_is_denied_with_a_message_naming_the_opt_out():
    body = review_with(lambda b: b["request"]["object"]["spec"].update(hostNetwork=True))
    response = review(body, CONFIG)["response"]
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "whole node's traffic" in message
    assert 'effect-sidecar.io/allow-host-network: "true"' in message


def test_a_host_network_pod_that_allows_it_is_admitted_unpatched_with_a_warning():
    def change(body: dict) -> None:
        pod = body["request"]["object"]
        pod["spec"]["hostNetwork"] = True
        pod["metadata"]["annotations"]["effect-sidecar.io/allow-host-network"] = "true"

    response = review(review_with(change), CONFIG)["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert any("WITHOUT the sidecar" in warning for warning in response["warnings"])


# --- Jobs ---------------------------------------------------------------------------------


def test_a_pod_of_an_indexed_job_is_patched_with_its_indexs_task():
    pod = job_pod(load(INDEXED_JOB), 2)
    response = review(admission(pod), CONFIG)["response"]
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    assert_valid(patched, NATIVE_VERSIONS)
    assert resolved_env(patched, "effect-sidecar")["SIDECAR_TASK"] == "indexed-job-2"


def job_admission(job: dict) -> dict:
    body = admission(job, kind=job["kind"])
    body["request"]["kind"]["group"] = "batch"
    body["request"]["resource"] = {"group": "batch", "version": "v1", "resource": "jobs"}
    return body


def test_a_parallel_job_without_indexes_is_admitted_unpatched_with_a_warning():
    response = review(job_admission(load(PARALLEL_JOB)), CONFIG)["response"]
    assert response["allowed"] is True
    assert "patch" not in response, "a Job's pods are injected, not the Job"
    (warning,) = response["warnings"]
    assert "share one task and one lease" in warning


def test_a_job_whose_pods_would_be_refused_is_refused_itself():
    job = load(INDEXED_JOB)
    job["spec"]["template"]["spec"]["hostNetwork"] = True
    response = review(job_admission(job), CONFIG)["response"]
    assert response["allowed"] is False
    assert "allow-host-network" in response["status"]["message"]
    assert review(job_admission(load(INDEXED_JOB)), CONFIG)["response"] == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }


# --- CA variables ---------------------------------------------------------------------------


def test_a_kept_ca_variable_comes_back_as_a_warning_kubectl_shows():
    response = review(admission(load(AGENT_POD)), CONFIG)["response"]
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert "container 'agent'" in warning
    assert "REQUESTS_CA_BUNDLE" in warning
