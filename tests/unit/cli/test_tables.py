"""Tables fit the terminal and keep the end of what they cut."""

from __future__ import annotations

from sidecar.cli import tables

PATH = "POST https://api.github.com/repos/acme/app/pulls/1234/requested_reviewers"


def test_a_long_cell_keeps_its_distinguishing_end():
    short = tables.shorten(PATH, 40)
    assert len(short) == 40
    assert short.endswith("/1234/requested_reviewers")
    assert short.startswith("POST https")


def test_only_flexible_columns_give_way_and_short_cells_stay_whole():
    rows = [("att-0123456789abcdef", "READ_COMPLETE", PATH)]
    text = tables.render(["ATTEMPT", "STAGE", "WHAT"], rows, flexible={"WHAT"}, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "att-0123456789abcdef  READ_COMPLETE" in text
    assert "requested_reviewers" in text


def test_without_a_width_nothing_is_cut():
    text = tables.render(["WHAT"], [(PATH,)], width=None)
    assert PATH in text


def test_columns_sets_the_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    assert tables.available_width() == 60
    monkeypatch.delenv("COLUMNS")
    assert tables.available_width() is None, "a pipe (pytest's capture) is not cut"
