"""The command line's durations (``30d``, ``12h``, ``90m``) and times, and that they stay
cheap to import: the control API parses the same durations in every ``sidecar serve``."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from sidecar.cli.durations import duration, since
from tests.support.imports import loaded_after_importing


def test_durations():
    assert duration("30d") == timedelta(days=30)
    assert duration("12h") == timedelta(hours=12)
    assert duration("90m") == timedelta(minutes=90)
    for bad in ("30", "0d", "1w", "-1d", "d"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


def test_since_takes_a_duration_back_from_now_or_a_time():
    assert since("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=UTC)
    assert abs(datetime.now(UTC) - timedelta(hours=12) - since("12h")) < timedelta(minutes=1)
    with pytest.raises(argparse.ArgumentTypeError):
        since("yesterday")


def test_importing_durations_loads_no_verb_nor_the_store():
    loaded = loaded_after_importing("sidecar.cli.durations")
    heavy = {
        "sidecar.cli.lifecycle",
        "sidecar.cli.control_client",
        "sidecar.cli.resolve",
        "sidecar.control.schemas",
        "sidecar.store",
    }
    assert not loaded & heavy
