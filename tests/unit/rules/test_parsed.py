"""A field read by a parser of ours and written back by another: what pydantic makes of it."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, ValidationError

from sidecar.rules.parsed import Parsed


class Upper:
    def __init__(self, source: str) -> None:
        self.source = source

    @staticmethod
    def parse(value: object) -> Upper:
        if not isinstance(value, str) or not value.isupper():
            raise ValueError(f"expected upper-case text, got {value!r}")
        return Upper(value)


class Holder(BaseModel):
    word: Annotated[Upper, Parsed(Upper.parse, lambda upper: upper.source)]
    words: Annotated[tuple[str, ...], Parsed(lambda v: tuple(v.split(",")), ",".join)] = ()


def test_the_parser_alone_reads_the_field_and_its_own_class_is_kept():
    held = Holder.model_validate({"word": "ABC", "words": "X,Y"})
    assert isinstance(held.word, Upper)
    assert held.word.source == "ABC"
    assert held.words == ("X", "Y")


def test_the_parsers_error_is_the_fields_error():
    with pytest.raises(ValidationError) as error:
        Holder.model_validate({"word": "abc"})
    (only,) = error.value.errors()
    assert only["loc"] == ("word",)
    assert only["msg"] == "Value error, expected upper-case text, got 'abc'"


def test_a_dump_writes_each_field_back_as_its_source():
    held = Holder.model_validate({"word": "ABC", "words": "X,Y"})
    assert held.model_dump() == {"word": "ABC", "words": "X,Y"}
    assert held.model_dump_json() == '{"word":"ABC","words":"X,Y"}'
    assert Holder.model_validate(held.model_dump()).words == held.words


def test_its_json_schema_takes_any_input_as_a_plain_validator_does():
    assert Holder.model_json_schema()["properties"]["word"] == {"title": "Word"}
