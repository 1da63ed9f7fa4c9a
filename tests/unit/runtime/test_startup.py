"""The start-up's garbage collection: older generations left alone until the process is
ready, then what it built frozen and the thresholds as they were."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sidecar.runtime import startup


@pytest.fixture(autouse=True)
def _collector_as_it_was() -> Iterator[None]:
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    startup.abandoned()
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    if enabled:
        gc.enable()


def test_the_older_generations_wait_until_the_process_is_ready() -> None:
    young, older, oldest = gc.get_threshold()
    startup.begin()
    assert gc.get_threshold() == (young, startup._NOT_DURING_START_UP, oldest)
    startup.begin()  # a second call changes nothing
    assert gc.get_threshold() == (young, startup._NOT_DURING_START_UP, oldest)
    startup.started()
    assert gc.get_threshold() == (young, older, oldest)
    assert gc.get_freeze_count() > 0  # what the start-up built is never scanned again


def test_a_start_up_that_failed_restores_the_thresholds_and_freezes_nothing() -> None:
    before = gc.get_threshold()
    startup.begin()
    startup.abandoned()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_process_that_did_not_begin_keeps_its_collector() -> None:
    gc.set_threshold(700, 10, 10)
    startup.started()  # e.g. a test that runs the server in its own process
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0


def test_a_disabled_collector_stays_as_it_is() -> None:
    gc.disable()
    before = gc.get_threshold()
    startup.begin()
    assert gc.get_threshold() == before
    startup.started()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("argv", [["serve", "--no-such-flag"], ["serve", "--help"]])
def test_a_serve_refused_before_it_started_leaves_the_collector_as_it_was(argv) -> None:
    from sidecar import cli  # noqa: PLC0415

    before = gc.get_threshold()
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert gc.get_threshold() == before
    startup.begin()  # and the next start-up still gets its collector
    assert gc.get_threshold()[1] == startup._NOT_DURING_START_UP
