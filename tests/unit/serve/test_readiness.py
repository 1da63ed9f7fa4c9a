"""Readiness conditions: pending until met, re-opened when lost, all named when checked."""

from __future__ import annotations

import pytest

from sidecar.errors import NotReady
from sidecar.serve.readiness import Readiness


def test_ready_only_once_every_declared_condition_is_met():
    readiness = Readiness()
    readiness.require("proxy", "the proxy is starting")
    readiness.require("lease", "the lease of task 312 is not held yet")
    with pytest.raises(NotReady) as refused:
        readiness.check()
    assert refused.value.pending == {
        "proxy": "the proxy is starting",
        "lease": "the lease of task 312 is not held yet",
    }
    assert refused.value.code == "not_ready"
    assert refused.value.status == 503
    assert "proxy: the proxy is starting" in refused.value.detail
    readiness.met("proxy")
    with pytest.raises(NotReady, match="lease"):
        readiness.check()
    readiness.met("lease")
    readiness.check()


def test_a_lost_condition_makes_it_not_ready_again_with_the_new_reason():
    readiness = Readiness()
    readiness.require("lease", "not held yet")
    readiness.met("lease")
    readiness.require("lease", "lost: fenced by generation 3")
    with pytest.raises(NotReady) as refused:
        readiness.check()
    assert refused.value.pending == {"lease": "lost: fenced by generation 3"}
    assert refused.value.extensions()["retry_after_s"] == 1.0
