"""The shipped Prometheus alert rules watch metrics the sidecar really exports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sidecar.runtime.metrics import Metrics

RULES = Path(__file__).parents[3] / "deploy" / "prometheus" / "effect-sidecar-alerts.yaml"


def exported_names() -> set[str]:
    metrics = Metrics()
    metrics.notifications.labels("effect_blocked", "delivered")  # labelled series exist once used
    names = set()
    for family in metrics.registry.collect():
        names |= {sample.name for sample in family.samples} | {family.name}
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_every_alert_names_a_metric_the_sidecar_exports_and_says_what_to_do():
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    alerts = [rule for group in groups for rule in group["rules"]]
    assert {a["alert"] for a in alerts} >= {"EffectWaitsForAHuman", "EffectStoreUnavailable"}
    exported = exported_names()
    for alert in alerts:
        used = set(re.findall(r"\bsidecar_[a-z_]+", alert["expr"]))
        assert used, alert["alert"]
        assert used <= exported, f"{alert['alert']}: {sorted(used - exported)} not exported"
        assert alert["annotations"]["runbook"], alert["alert"]
        assert alert["labels"]["severity"] in {"page", "ticket"}
