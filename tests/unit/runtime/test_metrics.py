"""The sidecar's own metrics registry."""

from __future__ import annotations

from sidecar.runtime.metrics import Metrics


def _sample(metrics: Metrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_labelled_child_is_made_once_and_counts_in_its_series() -> None:
    metrics = Metrics()
    replayed = metrics.effects_by("gh.pr", "replayed")

    assert metrics.effects_by("gh.pr", "replayed") is replayed
    replayed.inc()
    metrics.effects_by("gh.pr", "replayed").inc()
    metrics.effects_by("gh.pr", "recorded").inc()

    series = "sidecar_effects_total"
    assert _sample(metrics, series, {"rule": "gh.pr", "disposition": "replayed"}) == 2
    assert _sample(metrics, series, {"rule": "gh.pr", "disposition": "recorded"}) == 1
    assert metrics.effects.labels("gh.pr", "replayed") is replayed  # the registry's own
