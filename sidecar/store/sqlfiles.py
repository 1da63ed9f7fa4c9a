"""Loading the packaged ``.sql`` files: schemas, numbered migrations, named statements."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^(\d{4})_\w+\.sql$")


def _sql_dir(dialect: str) -> resources.abc.Traversable:
    return resources.files("sidecar.store") / "sql" / dialect


def read(dialect: str, name: str) -> str:
    return (_sql_dir(dialect) / name).read_text(encoding="utf-8")


def named_statements(dialect: str, name: str = "queries.sql") -> dict[str, str]:
    """Split a file into ``{name: statement}`` on ``-- name: NAME`` headers."""
    text = read(dialect, name)
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    statements = {
        parts[i]: parts[i + 1].strip().rstrip(";").strip() for i in range(1, len(parts), 2)
    }
    if len(statements) != (len(parts) - 1) // 2:
        raise ValueError(f"{dialect}/{name}: a statement name is used twice")
    return statements


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered file of ``migrations/``: its version, file name and SQL."""

    version: int
    name: str
    sql: str


def migrations(dialect: str) -> list[Migration]:
    """The dialect's migrations in version order; versions must run 1, 2, 3, ..."""
    found = []
    for entry in (_sql_dir(dialect) / "migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    expected = list(range(1, len(found) + 1))
    if [m.version for m in found] != expected:
        raise ValueError(f"{dialect} migrations are not numbered 0001..: {[m.name for m in found]}")
    return found
