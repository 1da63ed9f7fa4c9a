"""The admission decision: AdmissionReview v1 in, AdmissionReview v1 out."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from sidecar.kube.config import InjectConfig
from sidecar.kube.webhook import BadReview, review
from tests.unit.kube.manifests import AGENT_POD, NATIVE_VERSIONS, assert_valid, load

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
