"""Store writes turned into metrics: each operation counted under its own labels."""

from __future__ import annotations

from sidecar.runtime.metrics import Metrics
from sidecar.store.commands import AppendCheckpoint, Heartbeat
from sidecar.store.observed import MetricsObserver


def test_each_operation_is_counted_and_timed_under_its_own_labels() -> None:
    metrics = Metrics()
    observer = MetricsObserver(metrics)
    checkpoint = AppendCheckpoint("312", "att-1", 1, "S", {})
    for _ in range(3):
        observer.done(checkpoint, None, 0.002)
    observer.done(Heartbeat("312", "att-1", 1, None), None, 0.5)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("sidecar_store_writes_total", operation="checkpoint", outcome="ok") == 3
    assert value("sidecar_store_writes_total", operation="heartbeat", outcome="ok") == 1
    assert value("sidecar_store_write_seconds_count", operation="checkpoint") == 3
    assert value("sidecar_store_write_seconds_sum", operation="heartbeat") == 0.5
    assert value("sidecar_checkpoint_write_seconds_count") == 3
