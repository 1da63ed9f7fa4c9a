"""Rules about the code itself, checked on the source tree (no module is imported):

* every module of ``sidecar/`` has tests that name it: some file under ``tests/``
  imports it by its dotted name, or a test module in the mirrored folder is named
  after it (``tests/<layer>/<package path>/test_<module>[_<more>].py``);
* background tasks are started through :func:`sidecar.runtime.aio.spawn` (named, held, their
  death logged), not ``asyncio.create_task`` / ``asyncio.ensure_future`` /
  ``loop.create_task`` - except where the task is awaited (or cancelled and awaited) in
  the same function, or held and awaited by an owner that says so below.

Each rule keeps its exceptions in an explicit list with the reason; a listed exception
that no longer applies fails too, so the lists cannot silently rot."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "sidecar"
TESTS = ROOT / "tests"
LAYERS = ("unit", "integration", "acceptance")

PROCESS = "run as a process by the acceptance tests only"
EMULATOR = "the GitHub emulator's, run through `sidecar emulate` by tests/integration/emulators"
DEMO = "the demo's, run as processes by tests/acceptance/test_demo.py and the demo matrix"
ROUTES = "the control API's plumbing, exercised by every route test in tests/unit/control"

#: Modules with no test that names them, and where they are exercised instead.
ALLOW_LIST: dict[str, str] = {
    "sidecar.cli.demo": f"`sidecar demo`, {PROCESS}",
    "sidecar.cli.emulate": "`sidecar emulate`, started as a process by tests/integration/emulators",
    "sidecar.cli.inspect": f"`sidecar tasks` and `sidecar effects`, {PROCESS}",
    "sidecar.cli.matrix": f"`sidecar matrix`, {PROCESS} (tests/acceptance/matrix)",
    "sidecar.cli.options": "options every verb shares; tests/unit/cli/test_consistent_cli.py",
    "sidecar.cli.resume": f"`sidecar resume`, {PROCESS} (test_resume_process.py)",
    "sidecar.cli.review": f"`sidecar review`, {PROCESS} (test_review_process.py)",
    "sidecar.cli.serve": f"`sidecar serve`, {PROCESS} (test_serve_process.py and most others)",
    "sidecar.control.auth": f"bearer tokens, {ROUTES}",
    "sidecar.control.openapi": f"/v1/openapi.json, {ROUTES} (test_ops_routes.py fetches it)",
    "sidecar.control.pages": f"cursor pages, {ROUTES} (test_history_routes.py, listings)",
    "sidecar.control.problems": f"problem+json answers, {ROUTES}",
    "sidecar.control.resume": "resume routes; tests/acceptance/test_resume_process.py",
    "sidecar.demo.agent": DEMO,
    "sidecar.demo.check": DEMO,
    "sidecar.demo.matrix": DEMO,
    "sidecar.demo.model": DEMO,
    "sidecar.demo.scenario": DEMO,
    "sidecar.domain.lifecycle": "done/reopen rules, via the store: store/test_task_lifecycle.py",
    "sidecar.emulators.faults": "emulator fault injection; store/test_effect_resolution.py, matrix",
    "sidecar.emulators.github.api": EMULATOR,
    "sidecar.emulators.github.app": EMULATOR,
    "sidecar.emulators.github.contents": EMULATOR,
    "sidecar.emulators.github.git_http": EMULATOR,
    "sidecar.emulators.github.gitdata": EMULATOR,
    "sidecar.emulators.github.issues": EMULATOR,
    "sidecar.emulators.github.labels": EMULATOR,
    "sidecar.emulators.github.pulls": EMULATOR,
    "sidecar.emulators.github.pullstate": EMULATOR,
    "sidecar.emulators.github.releases": EMULATOR,
    "sidecar.emulators.github.repos": EMULATOR,
    "sidecar.emulators.github.server": EMULATOR,
    "sidecar.emulators.github.shapes": EMULATOR,
    "sidecar.emulators.github.state": EMULATOR,
    "sidecar.agent.isolation.forward": "exec's namespace forwarder; test_exec_isolation.py",
    "sidecar.kube.annotations": "pod annotations, through kube.inject: unit/kube/test_inject.py",
    "sidecar.kube.shape": "pod shape checks, through kube.inject: tests/unit/kube/test_inject.py",
    "sidecar.runtime.logs": "the processes' JSON logs, which the acceptance tests read",
    "sidecar.matrix.run": f"the matrix runner, {PROCESS} (tests/acceptance/matrix)",
    "sidecar.matrix.stack": f"the matrix's processes, {PROCESS} (tests/acceptance/matrix)",
    "sidecar.pgwire.ordinals": "n-th run keys; unit/pgwire/test_exactly_once.py repeats statements",
    "sidecar.runtime.problems": "problem texts of the proxy and the control API, through both",
    "sidecar.review.charts": "the report's charts; unit/control/test_review_report_route.py",
    "sidecar.review.collect": "the report's reads; test_review_report_route.py, review process",
    "sidecar.review.figures": "the report's numbers, through tally: unit/review/test_tally.py",
    "sidecar.review.proof": f"the review's proof section, {PROCESS} (test_review_process.py)",
    "sidecar.review.report_html": "the HTML report; unit/control/test_review_report_route.py",
    "sidecar.review.report_text": "the text report; test_review_report_route.py, review process",
    "sidecar.rules.patterns": "path patterns, through the matcher: unit/rules/test_matcher.py",
    "sidecar.store.sql_reads": "the SQL stores' reads; store/test_store_behaviour.py per backend",
    "sidecar.testing.upstream": "the counting upstream the README and the tests run as a process",
}

#: ``(file, function) -> (how many task starts, why)``: tasks started outside spawn.
TASK_EXCEPTIONS: dict[tuple[str, str], tuple[int, str]] = {
    ("sidecar/agent/worker.py", "_run_agent"): (2, "heartbeats and the child's wait, awaited here"),
    ("sidecar/emulators/github/git_http.py", "_backend"): (
        2, "git's stdin feed and stderr read, awaited in the same function",
    ),
    ("sidecar/kube/webhook.py", "CertReloader.watching.context"): (
        1, "an aiohttp cleanup context: cancelled and awaited when the app stops",
    ),
    ("sidecar/kube/webhook.py", "serve"): (1, "cancelled and awaited in the same function"),
    ("sidecar/kube/webhook.py", "_until_stopped"): (2, "raced with asyncio.wait, then awaited"),
    ("sidecar/pgwire/session.py", "_copy_both_ways"): (2, "both copy directions, gathered here"),
    ("sidecar/proxy/guard.py", "EffectGuard._forward_and_record"): (
        1, "the upstream send: awaited here, or awaited by the spawn()ed linger task",
    ),
}  # fmt: skip


def source_modules() -> list[str]:
    return sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in SOURCE.rglob("*.py")
        if path.name not in {"__init__.py", "__main__.py"}
    )


def imported_by_tests() -> set[str]:
    """Every dotted name a file under tests/ imports (``from a.b import c`` gives ``a.b``
    and ``a.b.c``: ``c`` may be a module)."""
    names: set[str] = set()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def has_named_test_module(module: str) -> bool:
    *package, name = module.split(".")[1:]
    for layer in LAYERS:
        folder = TESTS.joinpath(layer, *package)
        if (folder / f"test_{name}.py").exists() or any(folder.glob(f"test_{name}_*.py")):
            return True
    return False


def untested_modules() -> list[str]:
    imported = imported_by_tests()
    return [m for m in source_modules() if m not in imported and not has_named_test_module(m)]


def test_every_source_module_has_tests_that_name_it():
    missing = [m for m in untested_modules() if m not in ALLOW_LIST]
    assert not missing, (
        "these modules have no tests that name them - add "
        "tests/<unit|integration|acceptance>/<package path>/test_<module>.py (or import the "
        "module by name from an existing test), or add it to ALLOW_LIST in "
        f"{Path(__file__).relative_to(ROOT)} with the reason:\n  " + "\n  ".join(missing)
    )


def test_the_allow_list_holds_only_modules_still_without_tests():
    untested = set(untested_modules())
    stale = sorted(m for m in ALLOW_LIST if m not in untested)
    assert not stale, (
        "these ALLOW_LIST entries no longer apply (the module has tests now, or is gone): "
        "remove them:\n  " + "\n  ".join(stale)
    )


_STARTS = {"create_task", "ensure_future"}


class _TaskStarts(ast.NodeVisitor):
    """Calls that start a task: ``asyncio.create_task``, ``asyncio.ensure_future``,
    ``X.create_task`` (a loop or anything else), and the bare imported names."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, int, str]] = []  # (function, line, call)

    def _visit_scope(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_scope(node, node.name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_scope(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._visit_scope(node, node.name)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _STARTS:
            if func.attr == "create_task" or ast.unparse(func.value) == "asyncio":
                self.found.append((".".join(self.scope), node.lineno, ast.unparse(func)))
        elif isinstance(func, ast.Name) and func.id in _STARTS:
            self.found.append((".".join(self.scope), node.lineno, func.id))
        self.generic_visit(node)


def task_starts() -> dict[tuple[str, str], list[str]]:
    """``(file, function) -> ["file:line: call", ...]`` outside sidecar/runtime/aio.py."""
    starts: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative == "sidecar/runtime/aio.py":
            continue
        visitor = _TaskStarts()
        visitor.visit(ast.parse(path.read_text(), relative))
        for function, line, call in visitor.found:
            starts.setdefault((relative, function), []).append(f"{relative}:{line}: {call}(")
    return starts


def test_background_tasks_are_started_through_aio_spawn():
    wrong = []
    for place, calls in task_starts().items():
        allowed, _ = TASK_EXCEPTIONS.get(place, (0, ""))
        if len(calls) > allowed:
            wrong += calls
    assert not wrong, (
        "start background tasks with sidecar.runtime.aio.spawn(coro, name=...) - it names "
        "the task, "
        "holds a reference and logs its death; a task awaited in the same function may be "
        "listed in TASK_EXCEPTIONS with the reason:\n  " + "\n  ".join(wrong)
    )


def test_every_task_exception_still_applies():
    found = Counter({place: len(calls) for place, calls in task_starts().items()})
    stale = [
        f"{file} {function}: listed for {count}, found {found[(file, function)]}"
        for (file, function), (count, _) in TASK_EXCEPTIONS.items()
        if found[(file, function)] != count
    ]
    assert not stale, "update or remove these TASK_EXCEPTIONS entries:\n  " + "\n  ".join(stale)


def test_the_rules_find_what_they_look_for(tmp_path):
    """The checks themselves: a task started outside spawn is seen, spawn is not."""
    visitor = _TaskStarts()
    visitor.visit(
        ast.parse(
            "import asyncio\n"
            "from asyncio import ensure_future\n"
            "class A:\n"
            "    async def go(self, loop):\n"
            "        asyncio.create_task(x())\n"
            "        loop.create_task(x())\n"
            "        ensure_future(x())\n"
            "        asyncio.get_running_loop().create_task(x())\n"
            "        spawn(x(), name='fine')\n"
            "        asyncio.gather(x())\n"
        )
    )
    assert [(f, line) for f, line, _ in visitor.found] == [
        ("A.go", 5), ("A.go", 6), ("A.go", 7), ("A.go", 8),
    ]  # fmt: skip
    assert has_named_test_module("sidecar.store.group_commit")
    assert not has_named_test_module("sidecar.store.no_such_module")
