"""A rule field that a parser of ours reads and that is written back as its source text.

pydantic's ``PlainValidator`` with a ``PlainSerializer`` says the same, but for every
field that uses the pair, pydantic first builds (and then throws away) a schema for the
parsed type - a dataclass schema for a host pattern, a failed attempt for a class it
cannot describe - and inspects both functions' signatures.  That was most of the CPU of
importing the rules, which every ``sidecar serve`` start pays.  :class:`Parsed` hands
pydantic the core schema that pair ends with, directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema


class Parsed:
    """``Annotated[T, Parsed(parse, show)]``: validated by ``parse`` alone (its
    ValueErrors are the field's errors), serialised by ``show``."""

    __slots__ = ("parse", "show")

    def __init__(self, parse: Callable[[Any], Any], show: Callable[[Any], Any]) -> None:
        self.parse = parse
        self.show = show

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self.parse,
            serialization=core_schema.plain_serializer_function_ser_schema(self.show),
            json_schema_input_schema=core_schema.any_schema(),
        )
