"""Reading rule files: every problem in every file at once, each at its file and line.

PyYAML's composer keeps where each node starts; the nodes are turned into plain data
here (not by the constructor) so that every value's location path - such as
``("rules", 2, "match", "path")`` - is remembered with its line, and a pydantic error's
``loc`` can be pointed back at the line that caused it. Duplicate mapping keys, which
PyYAML silently lets the last one win, are refused on the way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from yaml.constructor import ConstructorError

from sidecar.errors import ConfigError
from sidecar.rules.lint import rule_warnings
from sidecar.rules.matcher import RuleSet, RuleSource
from sidecar.rules.model import FieldProblem, Rule, RuleFile

type Loc = tuple[str | int, ...]

SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One thing wrong in a rule file; ``line`` is 1-based, 0 when no line applies."""

    file: Path
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else str(self.file)
        return f"{where}: {self.message}"


class RuleError(ConfigError, code="invalid_rules", title="Invalid rules"):
    """The rule files are invalid."""

    def __init__(self, problems: Sequence[RuleProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


def load_rules(paths: Sequence[Path]) -> RuleSet:
    """The rules of every file given, or of every ``*.yaml``/``*.yml`` in a folder given.

    Folders are read non-recursively, files by name. Raises :class:`RuleError` naming
    every problem found in any of them; rule names must be unique across all files.
    """
    report = check_rules(paths)
    if report.problems:
        raise RuleError(report.problems)
    return report.rules


@dataclass(frozen=True, slots=True)
class RuleReport:
    """What ``rules check`` says: the valid rules, every problem and every warning."""

    rules: RuleSet
    problems: list[RuleProblem]
    warnings: list[RuleProblem]


def check_rules(paths: Sequence[Path]) -> RuleReport:
    """Every problem of every file in one pass, then the cross-rule checks (duplicate
    names, shadowed rules) over every rule that could be read, and warnings."""
    problems: list[RuleProblem] = []
    files = _files(paths, problems)
    rules: list[Rule] = []
    sources: dict[str, RuleSource] = {}
    for file in files:
        start = len(problems)
        loaded = _load_file(file, problems)
        for rule, name, line, name_line in loaded:
            first = sources.get(name)
            if first is not None:
                problems.append(
                    RuleProblem(
                        file,
                        name_line,
                        f"duplicate rule name {name!r} (first defined at "
                        f"{first.file}:{first.line})",
                    )
                )
                continue
            sources[name] = RuleSource(file, line)
            if rule is not None:
                rules.append(rule)
        problems[start:] = sorted(problems[start:], key=lambda problem: problem.line)
    valid = {rule.name for rule in rules}
    rule_set = RuleSet(rules, {n: s for n, s in sources.items() if n in valid}, files)
    warnings = [RuleProblem(at.file, at.line, text) for at, text in rule_warnings(rule_set)]
    return RuleReport(rule_set, problems, warnings)


def _files(paths: Sequence[Path], problems: list[RuleProblem]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            inside = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not inside:
                problems.append(RuleProblem(path, 0, "no .yaml or .yml files in this folder"))
            found += inside
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                problems.append(RuleProblem(path, 0, "not a .yaml or .yml file"))
            else:
                found.append(path)
        else:
            problems.append(RuleProblem(path, 0, "no such file or folder"))
    # The same file given twice (itself and through its folder) is read once.
    unique: dict[Path, Path] = {}
    for file in found:
        unique.setdefault(file.resolve(), file)
    return list(unique.values())


type Loaded = tuple[Rule | None, str, int, int]


def _load_file(file: Path, problems: list[RuleProblem]) -> list[Loaded]:
    """The file's rules, each (None if invalid) with its name, its line and its name's
    line (so an invalid rule's name is still checked for duplicates); problems appended."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        problems.append(RuleProblem(file, 0, f"cannot read: {error}"))
        return []
    converter = _Converter(file, problems)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = None if node is None else converter.convert(node, ())
    except yaml.YAMLError as error:
        problems.append(_yaml_problem(file, error))
        return []
    except RecursionError:  # merge keys (<<) that merge into themselves
        problems.append(RuleProblem(file, 1, "invalid YAML: aliases nest too deeply: refused"))
        return []
    if node is None:
        problems.append(RuleProblem(file, 1, "the file is empty; expected a mapping with 'rules'"))
        return []
    if not isinstance(data, dict):
        line = node.start_mark.line + 1
        problems.append(RuleProblem(file, line, "expected a mapping with the key 'rules'"))
        return []
    return _validate(file, data, converter.lines, problems)


def _yaml_problem(file: Path, error: yaml.YAMLError) -> RuleProblem:
    """Malformed YAML, or a merge key (<<) of something that is not a mapping."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return RuleProblem(file, 1, f"invalid YAML: {error}")
    mark = error.problem_mark or error.context_mark
    what = ": ".join(p for p in (error.context, error.problem) if p)
    return RuleProblem(file, mark.line + 1 if mark else 1, f"invalid YAML: {what}")


def _validate(
    file: Path, data: dict[str, Any], lines: dict[Loc, int], problems: list[RuleProblem]
) -> list[Loaded]:
    try:
        parsed = RuleFile.model_validate(data)
    except ValidationError as error:
        errors = error.errors()
        for details in errors:
            problems.append(_problem(file, details, lines))
        by_rule: dict[int, list[Loc]] = {}
        for d in errors:
            if len(d["loc"]) > 1 and d["loc"][0] == "rules" and isinstance(d["loc"][1], int):
                by_rule.setdefault(d["loc"][1], []).append(tuple(d["loc"]))
        raw = data.get("rules")
        if not isinstance(raw, list):
            return []
        loaded: list[Loaded] = []
        for index, item in enumerate(raw):
            where = (_line(lines, ("rules", index)), _name_line(lines, index))
            if index not in by_rule:
                rule = Rule.model_validate(item)
                loaded.append((rule, rule.name, *where))
                continue
            # One pass: what else is wrong with this rule, beyond its fields' errors.
            problems += _cross_field_problems(file, item, index, by_rule[index], lines)
            name = item.get("name") if isinstance(item, dict) else None
            if isinstance(name, str) and name:
                loaded.append((None, name, *where))
        return loaded
    return [
        (rule, rule.name, _line(lines, ("rules", index)), _name_line(lines, index))
        for index, rule in enumerate(parsed.rules)
    ]


# Without these the cross-field checks would say more about the stand-in than the rule.
_ESSENTIAL = frozenset({"match", "effect", "protocol"})


def _cross_field_problems(
    file: Path, item: Any, index: int, failed: list[Loc], lines: dict[Loc, int]
) -> list[RuleProblem]:
    """A rule whose fields failed is checked again without them, so the checks that
    relate its fields (``on_unknown: probe`` needs a ``probe``, ...) are reported in
    the same run rather than after its field errors are fixed.  A complaint that names a
    field left out is the stand-in's doing and is not reported."""
    if not isinstance(item, dict) or any(len(loc) < 3 for loc in failed):
        return []  # the rule itself is not a mapping, or its own check already failed
    left_out = {str(loc[2]) for loc in failed}
    if left_out & _ESSENTIAL:
        return []
    trimmed = {k: v for k, v in item.items() if k not in left_out}
    if "name" in left_out:
        trimmed["name"] = "stand-in"
    try:
        Rule.model_validate(trimmed)
    except ValidationError as again:
        found: list[RuleProblem] = []
        for details in again.errors():
            if details["type"] != "value_error" or details["loc"]:
                continue  # only the rule-level (cross-field) checks are new here
            cause = details.get("ctx", {}).get("error")
            text = str(cause) if cause is not None else details["msg"]
            if any(re.search(rf"\b{re.escape(field)}\b", text) for field in left_out):
                continue
            moved = dict(details)
            moved["loc"] = ("rules", index)
            found.append(_problem(file, cast("ErrorDetails", moved), lines))
        return found
    return []


def _name_line(lines: dict[Loc, int], index: int) -> int:
    return _line(lines, ("rules", index, "name"))


def _line(lines: dict[Loc, int], loc: Loc) -> int:
    """The line of the deepest recorded location on ``loc``'s path."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def _dotted(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "file"


def _without_tags(loc: Loc) -> Loc:
    """Drop the union tag pydantic puts after ``match`` ("http" or "sql"): it is not a key."""
    for at, part in enumerate(loc[:-1]):
        if part == "match" and loc[at + 1] in ("http", "sql"):
            return loc[: at + 1] + loc[at + 2 :]
    return loc


def _problem(file: Path, details: ErrorDetails, lines: dict[Loc, int]) -> RuleProblem:
    loc: Loc = _without_tags(tuple(details["loc"]))
    kind = details["type"]
    if kind == "extra_forbidden":
        message = f"{_dotted(loc[:-1])}: unknown field '{loc[-1]}'"
        return RuleProblem(file, _line(lines, loc), message)
    if kind == "missing":
        message = f"{_dotted(loc[:-1])}: missing field '{loc[-1]}'"
        return RuleProblem(file, _line(lines, loc[:-1]), message)
    cause = details.get("ctx", {}).get("error")
    if isinstance(cause, FieldProblem):
        loc += cause.field
    if kind == "value_error":
        message = str(cause) if cause is not None else details["msg"].removeprefix("Value error, ")
    else:
        # "Input should be a valid dictionary or instance of ProbeSpec": the class is noise.
        text = re.sub(r" or instance of \w+", "", details["msg"])
        message = text[:1].lower() + text[1:]
        got = repr(details["input"])
        message += f", got {got if len(got) <= 40 else got[:37] + '...'}"
    return RuleProblem(file, _line(lines, loc), f"{_dotted(loc)}: {message}")


# Values a rule file may expand to.  Aliases make the composed graph share nodes, so a few
# hundred bytes can stand for billions of values ("billion laughs") or for a value that
# contains itself; both are refused with the line of the node where the bound was hit.
MAX_VALUES = 20_000


class _Converter:
    """YAML nodes to plain data, recording each location's line and refusing duplicate keys
    and alias expansions beyond :data:`MAX_VALUES` (or into themselves)."""

    def __init__(self, file: Path, problems: list[RuleProblem]) -> None:
        self.file = file
        self.problems = problems
        self.lines: dict[Loc, int] = {}
        self._constructor = yaml.SafeLoader("")
        self._values = 0
        self._open: set[int] = set()  # the collections being converted, by identity

    def convert(self, node: yaml.Node, loc: Loc, line: int | None = None) -> Any:
        self._values += 1
        if self._values > MAX_VALUES:
            raise ConstructorError(
                None,
                None,
                f"the file expands to more than {MAX_VALUES:,} values through aliases: refused",
                node.start_mark,
            )
        if isinstance(node, yaml.CollectionNode):
            if id(node) in self._open:
                problem = "an alias here refers to a value that contains it: refused"
                raise ConstructorError(None, None, problem, node.start_mark)
            self._open.add(id(node))
            try:
                return self._convert(node, loc, line)
            finally:
                self._open.discard(id(node))
        return self._convert(node, loc, line)

    def _convert(self, node: yaml.Node, loc: Loc, line: int | None) -> Any:
        # A collection is reported at its key's line (``match:``), a scalar at its own.
        is_scalar = isinstance(node, yaml.ScalarNode)
        self.lines[loc] = node.start_mark.line + 1 if line is None or is_scalar else line
        if isinstance(node, yaml.SequenceNode):
            return [self.convert(item, (*loc, i)) for i, item in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            self._refuse_duplicates(node, loc)
            self._constructor.flatten_mapping(node)  # YAML merge keys: <<: *anchor
            mapping: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = str(self._constructor.construct_object(key_node))
                    key_line = key_node.start_mark.line + 1
                    mapping[key] = self.convert(value_node, (*loc, key), key_line)
            return mapping
        return self._constructor.construct_object(node)

    def _refuse_duplicates(self, node: yaml.MappingNode, loc: Loc) -> None:
        # Checked before merge keys are flattened: a key overriding a merged one is fine.
        seen: set[str] = set()
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(RuleProblem(self.file, line, "a key must be text"))
                continue
            key = str(self._constructor.construct_object(key_node))
            if key in seen:
                message = f"{_dotted(loc)}: duplicate key '{key}'"
                self.problems.append(RuleProblem(self.file, line, message))
            seen.add(key)
