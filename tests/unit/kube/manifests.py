"""Real-world manifests to inject, and the checks an injected manifest must pass.

``assert_valid`` validates against Kubernetes' own JSON schemas (kubernetes-validate,
strict: unknown fields refused) and adds what the schemas cannot say: container names
unique across containers and initContainers, env names and mount paths unique per
container, volume names unique, every volumeMount naming a volume. ``job_pod`` makes the
pods a Job's controller would, and ``resolved_env`` resolves a container's variables as
kubelet does, so a test can say which task each pod of a Job gets.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any

import kubernetes_validate
import yaml

#: Native sidecars (restartPolicy on init containers) are beta, on by default, from 1.29.
NATIVE_VERSIONS = ("1.29", kubernetes_validate.latest_version())
#: The fallback shape is for clusters before that.
FALLBACK_VERSIONS = ("1.28", kubernetes_validate.latest_version())

INJECT = {"effect-sidecar.io/inject": "true"}

AGENT_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: coding-agent
  namespace: agents
  labels: {app: coding-agent}
  annotations:
    effect-sidecar.io/inject: "true"
    effect-sidecar.io/task: "task-312"
spec:
  restartPolicy: Never
  containers:
    - name: agent
      image: ghcr.io/acme/agent:1.4
      args: ["--task", "312"]
      env:
        - {name: OPENAI_API_KEY, valueFrom: {secretKeyRef: {name: openai, key: key}}}
        - {name: REQUESTS_CA_BUNDLE, value: /etc/ssl/corp.pem}
      volumeMounts:
        - {name: workspace, mountPath: /workspace}
      resources:
        requests: {cpu: 500m, memory: 1Gi}
  volumes:
    - name: workspace
      emptyDir: {}
"""

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: triage-bot
  namespace: bots
spec:
  replicas: 2
  selector:
    matchLabels: {app: triage-bot}
  template:
    metadata:
      labels: {app: triage-bot, effect-sidecar.io/inject: "true"}
      annotations:
        effect-sidecar.io/mode: env-proxy
        effect-sidecar.io/task: triage-queue
    spec:
      serviceAccountName: triage-bot
      containers:
        - name: bot
          image: node:22
          command: [node, bot.js]
          env: [{name: NO_PROXY, value: "internal.acme"}]
          ports: [{containerPort: 8080}]
        - name: metrics
          image: prom/statsd-exporter:v0.26.0
"""

STATEFULSET = """
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: research-agent
spec:
  serviceName: research-agent
  replicas: 3
  selector:
    matchLabels: {app: research-agent}
  template:
    metadata:
      labels: {app: research-agent}
      annotations:
        effect-sidecar.io/inject: "true"
        effect-sidecar.io/pg-upstream: postgresql://postgres.db.svc:5432?sslmode=require
        effect-sidecar.io/pg-ports: "5432,6432"
        effect-sidecar.io/exclude-outbound-cidrs: "10.96.0.0/12, 169.254.169.254/32"
        effect-sidecar.io/include-outbound-ports: "80,443,8443"
        effect-sidecar.io/rules-configmap: research-rules
    spec:
      containers:
        - name: agent
          image: python:3.12-slim
          volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 1Gi}}
"""

JOB_WITH_INIT = """
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate-and-fix
  namespace: agents
spec:
  backoffLimit: 3
  template:
    metadata:
      annotations: {effect-sidecar.io/inject: "true"}
    spec:
      restartPolicy: OnFailure
      initContainers:
        - name: clone
          image: alpine/git:2.45
          args: [clone, "https://github.com/acme/app", /workspace]
          volumeMounts: [{name: workspace, mountPath: /workspace}]
      containers:
        - name: agent
          image: ghcr.io/acme/agent:1.4
          volumeMounts: [{name: workspace, mountPath: /workspace}]
      volumes:
        - {name: workspace, emptyDir: {}}
"""

JOB_PLAIN = """
apiVersion: batch/v1
kind: Job
metadata:
  name: nightly-report
spec:
  template:
    metadata:
      labels: {effect-sidecar.io/inject: "true"}
    spec:
      restartPolicy: Never
      containers:
        - name: report
          image: curlimages/curl:8.8.0
          command: [sh, -c, "curl -fsS https://api.example.com/report"]
"""

CRONJOB = """
apiVersion: batch/v1
kind: CronJob
metadata:
  name: dependency-bumper
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          annotations:
            effect-sidecar.io/inject: "true"
            effect-sidecar.io/native-sidecar: "false"
        spec:
          restartPolicy: Never
          containers:
            - name: bumper
              image: ghcr.io/acme/bumper:2
"""

POD_WITH_OTHER_SIDECAR = """
apiVersion: v1
kind: Pod
metadata:
  name: agent-with-logshipper
  annotations: {effect-sidecar.io/inject: "true"}
spec:
  initContainers:
    - name: fluent-bit
      image: fluent/fluent-bit:3.0
      restartPolicy: Always
      volumeMounts: [{name: logs, mountPath: /logs, readOnly: true}]
  containers:
    - name: agent
      image: ghcr.io/acme/agent:1.4
      env: [{name: SSL_CERT_FILE, value: /etc/ssl/certs/ca-certificates.crt}]
      volumeMounts: [{name: logs, mountPath: /logs}]
  volumes:
    - {name: logs, emptyDir: {}}
"""

ALL = {
    "agent-pod": AGENT_POD,
    "deployment": DEPLOYMENT,
    "statefulset": STATEFULSET,
    "job-with-init": JOB_WITH_INIT,
    "job": JOB_PLAIN,
    "cronjob": CRONJOB,
    "pod-with-other-sidecar": POD_WITH_OTHER_SIDECAR,
}


def load(text: str) -> dict[str, Any]:
    return dict(yaml.safe_load(text))


def pod_template(manifest: dict[str, Any]) -> dict[str, Any]:
    kind = manifest["kind"]
    if kind == "Pod":
        return manifest
    if kind == "CronJob":
        return dict(manifest["spec"]["jobTemplate"]["spec"]["template"])
    return dict(manifest["spec"]["template"])


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*(spec.get("initContainers") or []), *spec["containers"]]


def named(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(pod) if c["name"] == name)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def assert_valid(manifest: dict[str, Any], versions: tuple[str, ...]) -> None:
    for version in versions:
        kubernetes_validate.validate(copy.deepcopy(manifest), version, strict=True)
    pod = pod_template(manifest)
    spec = pod["spec"]
    names = Counter(c["name"] for c in containers(pod))
    assert [n for n, k in names.items() if k > 1] == [], "container names must be unique"
    volumes = Counter(v["name"] for v in spec.get("volumes") or [])
    assert [n for n, k in volumes.items() if k > 1] == [], "volume names must be unique"
    claims = {
        t["metadata"]["name"] for t in manifest.get("spec", {}).get("volumeClaimTemplates", [])
    }
    for container in containers(pod):
        env = Counter(item["name"] for item in container.get("env") or [])
        assert [n for n, k in env.items() if k > 1] == [], f"{container['name']}: env twice"
        mounts = container.get("volumeMounts") or []
        paths = Counter(m["mountPath"] for m in mounts)
        assert [p for p, k in paths.items() if k > 1] == [], f"{container['name']}: path twice"
        for mount in mounts:
            assert mount["name"] in set(volumes) | claims, f"no volume {mount['name']}"


#: The Kubernetes documentation's Indexed Job ("Indexed Job for Parallel Processing with
#: Static Work Assignment"), opted in: five completions, three pods at a time.
INDEXED_JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: indexed-job
  namespace: agents
spec:
  completions: 5
  parallelism: 3
  completionMode: Indexed
  template:
    metadata:
      labels: {effect-sidecar.io/inject: "true"}
    spec:
      restartPolicy: Never
      initContainers:
        - name: input
          image: docker.io/library/bash
          command:
            - bash
            - -c
            - |
              items=(foo bar baz qux xyz)
              echo ${items[$JOB_COMPLETION_INDEX]} > /input/data.txt
          volumeMounts: [{mountPath: /input, name: input}]
      containers:
        - name: worker
          image: docker.io/library/busybox
          command: [rev, /input/data.txt]
          volumeMounts: [{mountPath: /input, name: input}]
      volumes:
        - {name: input, emptyDir: {}}
"""

#: A work-queue Job: three pods at once, no completion indexes.
PARALLEL_JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: queue-workers
  namespace: agents
spec:
  parallelism: 3
  template:
    metadata:
      labels: {effect-sidecar.io/inject: "true"}
    spec:
      restartPolicy: OnFailure
      containers:
        - name: worker
          image: ghcr.io/acme/agent:1.4
"""

INDEX = "batch.kubernetes.io/job-completion-index"


def job_pod(job: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    """The pod the Job controller makes from ``job``'s template: its name, the ``job-name``
    labels, the completion index (annotation and, since 1.28, label), an owner reference,
    and ``JOB_COMPLETION_INDEX`` on every container that does not set it."""
    name = job["metadata"]["name"]
    pod = copy.deepcopy(pod_template(job))
    metadata = pod.setdefault("metadata", {})
    metadata["name"] = f"{name}-{index}-x7k2p" if index is not None else f"{name}-x7k2p"
    metadata["namespace"] = job["metadata"].get("namespace", "default")
    metadata.setdefault("labels", {}).update(
        {"job-name": name, "batch.kubernetes.io/job-name": name}
    )
    metadata["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u-1", "controller": True}
    ]
    if index is not None:
        metadata.setdefault("annotations", {})[INDEX] = str(index)
        metadata["labels"][INDEX] = str(index)
        for container in containers(pod):
            env = container.setdefault("env", [])
            if not any(item["name"] == "JOB_COMPLETION_INDEX" for item in env):
                env.append(
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {
                            "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}
                        },
                    }
                )
    return {"apiVersion": "v1", "kind": "Pod", **pod}


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _field(pod: dict[str, Any], path: str) -> str:
    metadata = pod["metadata"]
    if path in {"metadata.name", "metadata.namespace"}:
        return str(metadata.get(path.split(".")[1], ""))
    found = _FIELD.match(path)
    assert found, f"fieldRef {path} is not one kubelet resolves"
    return str((metadata.get(found[1]) or {}).get(found[2], ""))


def resolved_env(pod: dict[str, Any], container: str) -> dict[str, str]:
    """``container``'s variables as kubelet resolves them: a ``fieldRef`` from the pod's
    metadata, a ``value`` with ``$(VAR)`` replaced by a variable defined before it (left
    as written when there is none) and ``$$`` by ``$``; Secret references are left out."""
    resolved: dict[str, str] = {}

    def expand(found: re.Match[str]) -> str:
        if found[0] == "$$":
            return "$"
        return resolved.get(found[1], found[0])

    for item in named(pod, container).get("env") or []:
        if "value" in item:
            resolved[item["name"]] = _REFERENCE.sub(expand, item["value"])
        elif "fieldRef" in item.get("valueFrom", {}):
            resolved[item["name"]] = _field(pod, item["valueFrom"]["fieldRef"]["fieldPath"])
    return resolved
